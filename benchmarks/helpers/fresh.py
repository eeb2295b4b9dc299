"""One run of a benchmark script's own child in a process of its own: what gpu_overhead.py and
gpu_profile.py run each contender (and the bounds) in, so that one's staging, threads and
allocator never meet another's.

With a CUDA device the child is a fresh interpreter (`python script.py ... --one X`): a CUDA
context must never be forked. Without one (the CPU runs, the suite's among them) the child is
forked from the driver after the driver imported torch and `preload` (lightning, deepspeed)
once: a process of its own all the same (its own pid, memory and threads; stdout and stderr
of its own, read back as a cold child's), minus the ~3-7 s of imports a cold start repeats per
contender. The driver has run no thread and no torch operation before it forks; the child
runs the script's main() with the child's argv and environment, then its exit functions, and
exits with main()'s status.
"""
from __future__ import annotations

import atexit
import importlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Callable, Sequence

import torch


def forks() -> bool:
    """Whether children are forked here (no CUDA device), rather than started cold."""
    return not torch.cuda.is_available()


def run(script: str, args: Sequence[str], main: Callable[[], None], timeout: float,
        env: dict | None = None, preload: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """`python script *args` as subprocess.run(capture_output=True, text=True) runs it (raises
    subprocess.TimeoutExpired after `timeout`), forked when forks() says so."""
    argv = [script, *args]
    if not forks():
        return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, **(env or {})))
    for name in preload:
        importlib.import_module(name)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _child(argv, main, env or {}, out.fileno(), err.fileno())
        status = _wait(pid, timeout)
        if status is None:
            raise subprocess.TimeoutExpired(argv, timeout)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, status, out.read(), err.read())


def _child(argv, main, env, out_fd: int, err_fd: int) -> None:
    code = 1
    try:
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.environ.update(env)
        sys.argv = list(argv)
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - as a cold child's traceback
            traceback.print_exc()
        atexit._run_exitfuncs()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _wait(pid: int, timeout: float) -> int | None:
    """The child's exit status (a signal's as -signum), or None once killed after `timeout`."""
    end = time.monotonic() + timeout
    pause = 0.005
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= end:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(pause)
        pause = min(pause * 2, 0.1)
