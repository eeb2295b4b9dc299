"""Forked children: a function run in a child that reports one JSON result, and a writer
child that reports lines until it is killed with SIGKILL.

The parent must stay free of threads and of OpenMP work (neither survives fork), so
every check that touches tensors runs in a child of its own.
"""
from __future__ import annotations

import json
import os
import resource
import select
import signal
import time
import traceback
from typing import Callable


def _child(fn: Callable, args: tuple, wfd: int, mem_limit: int | None) -> None:
    code = 0
    try:
        if mem_limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (mem_limit, mem_limit))
        out = fn(*args)
        payload = json.dumps({"ok": True, "result": out})
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which judges it
        payload = json.dumps({"ok": False, "type": type(e).__name__, "error": str(e)[:2000],
                              "trace": traceback.format_exc()[-4000:]})
        code = 1
    try:
        os.write(wfd, payload.encode() + b"\n")
    finally:
        os._exit(code)


def _read_all(rfd: int, deadline: float) -> tuple[bytes, bool]:
    chunks, timed_out = [], False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        r, _, _ = select.select([rfd], [], [], min(left, 1.0))
        if r:
            b = os.read(rfd, 1 << 16)
            if not b:
                break
            chunks.append(b)
    return b"".join(chunks), timed_out


def call(fn: Callable, *args, timeout: float = 120.0, mem_limit: int | None = None) -> dict:
    """fn(*args) in a forked child. {"ok": True, "result": ...} or {"ok": False, "type", "error"},
    or {"ok": False, "type": "killed", "signal": N} / {"type": "timeout"}."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        _child(fn, args, wfd, mem_limit)
    os.close(wfd)
    raw, timed_out = _read_all(rfd, time.monotonic() + timeout)
    os.close(rfd)
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if timed_out:
        return {"ok": False, "type": "timeout", "error": f"no answer within {timeout}s"}
    if os.WIFSIGNALED(status):
        return {"ok": False, "type": "killed", "signal": os.WTERMSIG(status),
                "error": f"child died of signal {os.WTERMSIG(status)}"}
    try:
        return json.loads(raw.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"ok": False, "type": "no-result", "error": f"exit status {status}, output {raw[:200]!r}"}


def kill_during(loop: Callable[[Callable[[str], None]], None], args: tuple, delay: float,
                ready_timeout: float = 60.0) -> list[str]:
    """Forks a child running loop(emit, *args); once it emits "ready", lets it run `delay`
    seconds and kills it with SIGKILL. Returns every line it emitted, in order."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)

        def emit(line: str) -> None:
            os.write(wfd, line.encode() + b"\n")
        try:
            loop(emit, *args)
        except BaseException:  # noqa: BLE001
            emit("error " + traceback.format_exc().replace("\n", " | ")[-1500:])
        os._exit(1)
    os.close(wfd)
    buf, lines, kill_at = b"", [], None
    deadline = time.monotonic() + ready_timeout
    while True:
        now = time.monotonic()
        if kill_at is not None and now >= kill_at:
            break
        if kill_at is None and now >= deadline:
            break
        wait = (kill_at if kill_at is not None else deadline) - now
        r, _, _ = select.select([rfd], [], [], max(0.0, wait))
        if not r:
            continue
        b = os.read(rfd, 1 << 16)
        if not b:
            break  # the child ended by itself (an error it emitted)
        buf += b
        *done, buf = buf.split(b"\n")
        for line in done:
            text = line.decode()
            if text == "ready" and kill_at is None:
                kill_at = time.monotonic() + delay
            lines.append(text)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    rest, _ = _read_all(rfd, time.monotonic() + 5)
    os.close(rfd)
    lines += [x.decode() for x in (buf + rest).split(b"\n") if x]
    if "ready" not in lines:
        raise RuntimeError(f"the writer child never became ready: {lines[-3:]}")
    return lines
