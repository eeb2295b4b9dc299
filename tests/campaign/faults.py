"""Part 3: faults under a running job — a full disk (ENOSPC: a small tmpfs), an I/O error
(EIO: eio_shim.c preloaded, failing every write and fsync under the root after a byte
budget, as a failing device does) and a directory that turns read-only (a remount) — for the
Checkpointer and for Lightning's FastCheckpointIO, with on_error="raise" and "warn".

Each run is a child process (fault_child.py) that checkpoints every step. It passes when:
raise -> training stopped with a CheckpointWriteError naming the cause; warn -> training
ran every step and warned; and in both cases every checkpoint committed before the fault
still loads, verified and bit-exact, and no temporary file is left under a final name.
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
import uuid

import forked

HERE = os.path.dirname(os.path.abspath(__file__))
# the children start through tests/support/warm.py; tests/ is on the path only while it is imported
# (its test folders, tests/fastckpt among them, would shadow the packages they test)
sys.path.insert(0, os.path.dirname(HERE))
try:
    from support import warm
finally:
    sys.path.remove(os.path.dirname(HERE))
STEPS = 6
MIB = 1 << 20
# bytes that hold two checkpoints but not three: 2 MiB states / the Lightning model + Adam (~3.2 MB)
ROOM = {"checkpointer": 5 * MIB, "lightning": 8 * MIB}
CAUSE = {"enospc": "No space left", "eio": "Input/output error", "readonly": ("Read-only", "not writable")}


def build_shim(out_dir: str) -> str:
    so = os.path.join(out_dir, "eio_shim.so")
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", so, os.path.join(HERE, "eio_shim.c"), "-ldl"],
                   check=True, capture_output=True)
    return so


def _mount(size: int) -> str:
    d = tempfile.mkdtemp(prefix="fastckpt-fault-")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", d], capture_output=True, text=True)
    if r.returncode != 0:
        raise PermissionError(f"cannot mount a tmpfs here ({r.stderr.strip()}); the ENOSPC and "
                              "read-only faults need root (or a prepared mount)")
    return d


def _umount(d: str) -> None:
    subprocess.run(["umount", "-l", d], capture_output=True)
    os.rmdir(d)


def _child(mode: str, root: str, on_error: str, env: dict, ro_after: int | None) -> list[str]:
    args = [sys.executable, os.path.join(HERE, "fault_child.py"), mode, root, on_error, str(STEPS)]
    if ro_after is not None:
        args.append(str(ro_after))
    # the checkout (its siblings come with the script), then what this process was given
    paths = [os.path.dirname(os.path.dirname(HERE)), os.environ.get("PYTHONPATH", "")]
    proc = warm.run(args, capture_output=True, text=True, timeout=300,
                    env=dict(os.environ, **env, PYTHONPATH=os.pathsep.join(p for p in paths if p)),
                    preload=("lightning",) if mode == "lightning" else ())
    lines = proc.stdout.splitlines()
    if proc.returncode != 0:
        lines.append(f"crashed {proc.returncode}: {proc.stderr[-1500:]}")
    return lines


def _survivors(mode: str, root: str) -> dict:
    """What a restarted job finds: the newest checkpoint, loaded and checked."""
    import warnings

    import fastckpt
    from fastckpt.store.path_store import TMP_GLOB
    warnings.simplefilter("ignore")
    leftovers = glob.glob(os.path.join(root, TMP_GLOB))
    if mode == "checkpointer":
        from states import same, state_for
        with fastckpt.Checkpointer(root) as ck:
            info = ck.latest()
            if info is None:
                return {"step": None, "same": False, "leftovers": leftovers}
            return {"step": info.step, "same": same(ck.load(), state_for(info.step, mib=2)), "leftovers": leftovers}
    steps = []
    for path in glob.glob(os.path.join(root, "*.ckpt")):
        steps.append(int(fastckpt.load(path)["global_step"]))  # every file under a final name loads
    return {"step": max(steps, default=None), "same": True, "files": len(steps), "leftovers": leftovers}


def one(fault: str, mode: str, on_error: str, shim: str) -> dict:
    env: dict = {}
    mounted = None
    ro_after = None
    if fault in ("enospc", "readonly"):
        mounted = _mount(ROOM[mode] if fault == "enospc" else 64 * MIB)
        root = os.path.join(mounted, "ck")
        ro_after = 2 if fault == "readonly" else None
    else:
        root = os.path.join(tempfile.gettempdir(), f"fastckpt-eio-{uuid.uuid4().hex[:8]}", "ck")
        os.makedirs(root)
        env = {"LD_PRELOAD": shim, "FASTCKPT_FAULT_PATH": root, "FASTCKPT_FAULT_AFTER": str(ROOM[mode])}
    try:
        lines = _child(mode, root, on_error, env, ro_after)
        committed = max([int(x.split()[1]) for x in lines if x.startswith("committed")], default=0)
        stopped = next((x for x in lines if x.startswith(("stopped", "crashed"))), None)
        warned = next((int(x.split()[1]) for x in lines if x.startswith("warned")), 0)
        got = forked.call(_survivors, mode, root, timeout=120)
    finally:
        if mounted is not None:
            _umount(mounted)
        else:
            subprocess.run(["rm", "-rf", os.path.dirname(root)])
    res = got.get("result") or {}
    cause = CAUSE[fault] if isinstance(CAUSE[fault], tuple) else (CAUSE[fault],)
    problems = []
    if on_error == "raise":
        if stopped is None or not stopped.startswith("stopped CheckpointWriteError"):
            problems.append(f"expected training to stop with a CheckpointWriteError, got {stopped or 'a finished run'}")
        elif not any(c in stopped for c in cause):
            problems.append(f"the error does not name the cause {cause}: {stopped[:300]}")
    else:
        if stopped is not None:
            problems.append(f"on_error='warn' but training stopped: {stopped[:300]}")
        elif warned == 0:
            problems.append("on_error='warn' but nothing was warned about")
    if not got["ok"]:
        problems.append(f"the survivors do not load: {got.get('type')}: {got.get('error', '')[:300]}")
    else:
        if res.get("step") is None or res["step"] < max(committed, 1):
            problems.append(f"newest surviving checkpoint is step {res.get('step')}, {committed} was committed")
        if not res.get("same"):
            problems.append("the newest surviving checkpoint differs from what was saved")
        if res.get("leftovers"):
            problems.append(f"temporary files left: {res['leftovers'][:3]}")
    return {"fault": fault, "mode": mode, "on_error": on_error, "committed_before": committed,
            "survivor_step": res.get("step"), "stopped": (stopped or "")[:200], "warned": warned,
            "ok": not problems, "problems": problems}


def run(work: str) -> dict:
    shim = build_shim(work)
    rows = [one(fault, mode, on_error, shim) for fault in ("enospc", "eio", "readonly")
            for mode in ("checkpointer", "lightning") for on_error in ("raise", "warn")]
    return {"runs": len(rows), "passed": sum(r["ok"] for r in rows), "rows": rows,
            "failures": [f"{r['fault']} {r['mode']} {r['on_error']}: {'; '.join(r['problems'])}"
                         for r in rows if not r["ok"]]}
