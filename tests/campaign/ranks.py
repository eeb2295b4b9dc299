"""Part 4: distributed — 2 to 4 gloo ranks checkpoint together; one rank, chosen at random, is
killed with SIGKILL at a random moment (mid-save or mid-commit); the others notice through
the commit timeout and the job dies. A restarted job (every rank) then loads: every rank
must resume from the same global step, at or after the last step any rank saw committed,
with its own state bit for bit, and must be able to checkpoint again.
"""
from __future__ import annotations

import os
import random
import select
import signal
import socket
import time

from states import same, state_for


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _seed(rank: int, step: int) -> int:
    return 1000 * step + rank


def _rank_main(mode: str, root: str, rank: int, world: int, port: int, emit) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    import fastckpt
    dist.init_process_group("gloo")
    ck = fastckpt.Checkpointer(root, concurrency=2, chunk_mb=1, keep=3, commit_timeout_s=5)
    if mode == "loop":
        emit("ready")
        step, pending = 1, []
        while True:
            pending.append(ck.save(state_for(_seed(rank, step), mib=0.25), step=step))
            step += 1
            while pending and (len(pending) >= 2 or pending[0].done()):
                emit(f"committed {pending.pop(0).wait().step}")
    info = ck.latest()
    out = ck.load()
    exact = same(out, state_for(_seed(rank, info.step), mib=0.25))
    ck.save(state_for(_seed(rank, info.step + 1), mib=0.25), step=info.step + 1).wait()
    emit(f"resumed {info.step} {int(exact)}")
    ck.close()
    dist.destroy_process_group()


def _spawn(mode: str, root: str, world: int) -> list[tuple[int, int]]:
    port = _port()
    out = []
    for rank in range(world):
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(rfd)
            code = 0
            try:
                _rank_main(mode, root, rank, world, port, lambda line: os.write(wfd, line.encode() + b"\n"))
            except BaseException as e:  # noqa: BLE001 - the parent reads it
                os.write(wfd, f"error {type(e).__name__}: {str(e)[:300]}\n".encode())
                code = 1
            os._exit(code)
        os.close(wfd)
        out.append((pid, rfd))
    return out


def _collect(procs, until: float, stop_when=None) -> list[list[str]]:
    """Lines of each child until `until` (monotonic), all pipes closed, or stop_when(lines)."""
    lines: list[list[str]] = [[] for _ in procs]
    bufs = [b"" for _ in procs]
    open_fds = {rfd: i for i, (_, rfd) in enumerate(procs)}
    while open_fds and time.monotonic() < until and not (stop_when and stop_when(lines)):
        r, _, _ = select.select(list(open_fds), [], [], max(0.0, min(0.2, until - time.monotonic())))
        for fd in r:
            i = open_fds[fd]
            b = os.read(fd, 1 << 16)
            if not b:
                del open_fds[fd]
                continue
            bufs[i] += b
            *done, bufs[i] = bufs[i].split(b"\n")
            lines[i] += [x.decode() for x in done]
    return lines


def _end(procs) -> None:
    for pid, rfd in procs:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        os.close(rfd)


def one_round(root: str, world: int, rng: random.Random) -> dict:
    procs = _spawn("loop", root, world)
    try:
        lines = _collect(procs, time.monotonic() + 120, lambda ls: all("ready" in x for x in ls))
        if not all("ready" in x for x in lines):
            return {"ok": False, "problem": f"ranks never became ready: {[x[-2:] for x in lines]}"}
        more = _collect(procs, time.monotonic() + rng.uniform(0.2, 1.5))
        victim = rng.randrange(world)
        os.kill(procs[victim][0], signal.SIGKILL)
        rest = _collect(procs, time.monotonic() + 30)  # survivors time out on the commit and die
    finally:
        _end(procs)
    every = [a + b + c for a, b, c in zip(lines, more, rest)]
    committed = max([int(x.split()[1]) for ls in every for x in ls if x.startswith("committed")], default=0)
    procs = _spawn("resume", root, world)
    try:
        after = _collect(procs, time.monotonic() + 120, lambda ls: all(any(x.startswith(("resumed", "error")) for x in l) for l in ls))
    finally:
        _end(procs)
    resumed = [next((x for x in ls if x.startswith(("resumed", "error"))), "nothing") for ls in after]
    steps = {x.split()[1] for x in resumed if x.startswith("resumed")}
    problem = None
    if any(not x.startswith("resumed") for x in resumed):
        problem = f"a rank could not resume: {resumed}"
    elif len(steps) != 1:
        problem = f"ranks resumed from different steps: {resumed}"
    elif int(next(iter(steps))) < committed:
        problem = f"resumed step {next(iter(steps))} < committed {committed}"
    elif not all(x.endswith(" 1") for x in resumed):
        problem = f"a rank's state differs from what it saved: {resumed}"
    return {"ok": problem is None, "problem": problem, "victim": victim, "committed": committed,
            "resumed": int(next(iter(steps))) if len(steps) == 1 else None}


def run(rounds: int, work: str, worlds=(2, 3, 4), seed: int = 4) -> dict:
    rng = random.Random(seed)
    rows, failures = {}, []
    for world in worlds:
        root = os.path.join(work, f"ranks-{world}")
        row = rows.setdefault(f"{world} ranks", {"rounds": 0, "same_step": 0, "ahead": []})
        for i in range(rounds):
            r = one_round(root, world, rng)
            row["rounds"] += 1
            if r["ok"]:
                row["same_step"] += 1
                row["ahead"].append(r["resumed"] - r["committed"])
            else:
                failures.append(f"{world} ranks, round {i}: {r['problem']}")
    table = {k: {"rounds": v["rounds"], "resumed_same_step": v["same_step"],
                 "max_steps_ahead_of_report": max(v["ahead"], default=None)} for k, v in rows.items()}
    return {"rounds": sum(v["rounds"] for v in rows.values()),
            "resumed_same_step": sum(v["same_step"] for v in rows.values()), "by_world": table,
            "failures": failures}
