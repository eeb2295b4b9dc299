"""Part 2: random corruptions of a committed root: bit flips (anywhere, in the first 4 KiB,
in the last 64 bytes), truncations and zeroed pages of the newest checkpoint's file, a deleted, torn or flipped commit record, a deleted or garbled
`latest`, and two checkpoints damaged at once.

A root of three checkpoints (steps 1-3) is written once per format; each trial damages a
fresh copy and a forked child answers as a restarted job would: `fastckpt verify` of the
damaged checkpoint and `Checkpointer.load()` of the root. Detected means: verify flags the
damaged checkpoint, and load returns the newest undamaged one, bit for bit (step 2, step 1
when two are damaged, step 3 when only `latest` was touched: it is a hint, never trusted).
"""
from __future__ import annotations

import os
import random
import shutil

import forked
from states import same, state_for

DATA_KINDS = ("bitflip", "head_bitflip", "tail_bitflip", "truncate", "zero_page")
COMMIT_KINDS = ("commit_delete", "commit_torn", "commit_bitflip")
LATEST_KINDS = ("latest_delete", "latest_torn", "latest_garbage")
KINDS = DATA_KINDS + COMMIT_KINDS + LATEST_KINDS + ("two_checkpoints",)


def _build(root: str, fmt: str) -> None:
    import fastckpt
    with fastckpt.Checkpointer(root, format=fmt, keep=3, chunk_mb=1) as ck:
        for step in (1, 2, 3):
            ck.save(state_for(step, mib=0.5), step=step).wait()


def _checkpoints(root: str) -> list[str]:
    """Checkpoint directories, newest first."""
    dirs = [d for d in os.listdir(root) if d.startswith("step-")]
    return [os.path.join(root, d) for d in sorted(dirs, key=lambda d: int(d.split(".c")[1]), reverse=True)]


def _data_file(ckpt: str) -> str:
    return os.path.join(ckpt, next(n for n in os.listdir(ckpt) if n.startswith("rank-")))


def _flip(path: str, rng: random.Random, where: str = "any") -> str:
    """One bit anywhere, or in the first 4 KiB (headers, pickle, safetensors JSON), or in the last
    64 bytes (zip directory end and comment): the metadata a uniform flip rarely hits."""
    size = os.path.getsize(path)
    lo, hi = {"any": (0, size), "head": (0, min(size, 4096)), "tail": (max(0, size - 64), size)}[where]
    off, bit = rng.randrange(lo, hi), rng.randrange(8)
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)[0]
        f.seek(off)
        f.write(bytes([b ^ (1 << bit)]))
    return f"bit {bit} of byte {off}/{size}"


def _truncate(path: str, rng: random.Random) -> str:
    size = os.path.getsize(path)
    n = rng.randrange(size)
    os.truncate(path, n)
    return f"to {n}/{size} bytes"


def _zero_page(path: str, rng: random.Random) -> str:
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        pages = list(range(0, size, 4096))
        rng.shuffle(pages)
        for off in pages:  # a page already all zeros (alignment padding) is no damage: take another
            f.seek(off)
            block = f.read(4096)
            if block.count(0) != len(block):
                f.seek(off)
                f.write(bytes(len(block)))
                return f"page at {off}/{size}"
    raise RuntimeError(f"{path} is all zeros")


def damage(root: str, kind: str, rng: random.Random) -> tuple[str, int]:
    """Applies one corruption; returns (what was done, the step a correct load returns)."""
    newest, older = _checkpoints(root)[0], _checkpoints(root)[1]
    commit_rec, latest = os.path.join(newest, "COMMIT"), os.path.join(root, "latest")
    if kind in DATA_KINDS:
        fn = {"bitflip": _flip, "truncate": _truncate, "zero_page": _zero_page,
              "head_bitflip": lambda p, r: _flip(p, r, "head"), "tail_bitflip": lambda p, r: _flip(p, r, "tail")}[kind]
        return f"{kind} {fn(_data_file(newest), rng)}", 2
    if kind == "commit_delete":
        os.unlink(commit_rec)
        return kind, 2
    if kind == "commit_torn":
        return f"commit_torn {_truncate(commit_rec, rng)}", 2
    if kind == "commit_bitflip":
        return f"commit_bitflip {_flip(commit_rec, rng)}", 2
    if kind == "latest_delete":
        os.unlink(latest)
        return kind, 3
    if kind == "latest_torn":
        return f"latest_torn {_truncate(latest, rng)}", 3
    if kind == "latest_garbage":
        with open(latest, "wb") as f:
            f.write(rng.choice([b"\x00" * 64, b'{"dir": "../../etc", "step": 99, "counter": 1e999}',
                                bytes(rng.randrange(256) for _ in range(100))]))
        return kind, 3
    if kind == "two_checkpoints":
        a = _flip(_data_file(newest), rng)
        b = _zero_page(_data_file(older), rng)
        return f"two_checkpoints newest {a}, previous {b}", 1
    raise ValueError(kind)


def _judge(root: str, damaged: str) -> dict:
    import contextlib
    import io
    import warnings

    import fastckpt
    from fastckpt.tools.cli import main as cli_main
    with contextlib.redirect_stdout(io.StringIO()):
        flagged = cli_main(["verify", damaged]) != 0
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        with fastckpt.Checkpointer(root) as ck:
            info = ck.latest()
            out = ck.load()
            step = out["step"]
            exact = same(out, state_for(step, mib=0.5))
    return {"flagged": flagged, "step": step, "same": exact, "latest": info.step if info else None}


def run(n: int, work: str, seed: int = 2) -> dict:
    rng = random.Random(seed)
    pristine = {}
    for fmt in ("torch", "safetensors"):
        pristine[fmt] = os.path.join(work, f"pristine-{fmt}")
        shutil.rmtree(pristine[fmt], ignore_errors=True)
        got = forked.call(_build, pristine[fmt], fmt)
        if not got["ok"]:
            raise RuntimeError(f"could not build the {fmt} root: {got}")
    rows: dict = {}
    failures = []
    trial = os.path.join(work, "trial")
    for i in range(n):
        fmt = ("torch", "safetensors")[i % 2]
        kind = KINDS[(i // 2) % len(KINDS)]
        shutil.rmtree(trial, ignore_errors=True)
        shutil.copytree(pristine[fmt], trial)
        newest = _checkpoints(trial)[0]
        what, expect = damage(trial, kind, rng)
        got = forked.call(_judge, trial, newest, timeout=120)
        res = got.get("result") or {}
        row = rows.setdefault(f"{fmt} {kind}", {"trials": 0, "detected": 0})
        row["trials"] += 1
        must_flag = expect != 3
        bad = None
        if not got["ok"]:
            bad = f"raised {got.get('type')}: {got.get('error', '')[:300]}"
        elif res["step"] != expect or not res["same"]:
            bad = f"loaded step {res['step']} (same={res['same']}), expected step {expect}"
        elif must_flag and not res["flagged"]:
            bad = "fastckpt verify did not flag the damaged checkpoint"
        elif not must_flag and res["flagged"]:
            bad = "fastckpt verify flagged an undamaged checkpoint"
        if bad is None:
            row["detected"] += 1
        else:
            failures.append(f"trial {i} {fmt} {what}: {bad}")
    detected = sum(r["detected"] for r in rows.values())
    return {"corruptions": n, "detected": detected, "detected_pct": 100.0 * detected / max(1, n),
            "by_kind": dict(sorted(rows.items())), "failures": failures[:30]}
