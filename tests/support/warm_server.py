"""The warm interpreter behind tests/support/warm.py: a Python process that imported torch (and,
where asked, lightning or deepspeed) once, then forks one child per program a test starts.

Each child is a real process (its own pid, real signals, kill -9, its own process group when
asked), set up as `python SCRIPT ARGS`, `python -m MODULE ARGS` or `python -c CODE ARGS` would be:
the caller's stdin/stdout/stderr, environment, working directory, sys.argv and sys.path (the
program's own folder, then PYTHONPATH, then the interpreter's), fresh signal dispositions, the
thread count OMP_NUM_THREADS asks for, unbuffered output under PYTHONUNBUFFERED. At the end it
exits as Python does: non-daemon threads joined, atexit callbacks run, streams flushed,
SystemExit's code or 1 after a traceback.

    python warm_server.py SOCKET MODULE[,MODULE...]

prints "ready" once it listens on the unix socket SOCKET; a request is one JSON object (argv, env,
cwd, session) with the child's three file descriptors; the answer is "pid N", then, when the child
ended, "status S" (its waitpid status). It exits when its stdin closes (the test process ended).
Nothing of the project is imported here: every child imports the tree its PYTHONPATH names.
"""
from __future__ import annotations

import atexit
import builtins
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import threading
import types

PROJECT = ("fastckpt", "lightning_fastckpt", "deepspeed_fastckpt", "torchtitan_fastckpt")


def preload(modules: list[str]) -> list[str]:
    """Imports the modules; returns sys.path as a fresh interpreter has it, without this script's
    folder and without PYTHONPATH's entries (each child puts its own in front)."""
    for name in modules:
        __import__(name)
    here = os.path.dirname(os.path.abspath(__file__))
    own = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    base = [p for p in sys.path if p and os.path.abspath(p) != here and os.path.abspath(p) not in own]
    loaded = [m for m in PROJECT if m in sys.modules]
    assert not loaded, f"the warm interpreter must not import the project ({loaded}): children import their own tree"
    # no Python thread may run at fork (numpy's OpenBLAS parks a thread pool of its own, which it
    # shuts down and restarts across fork itself)
    assert threading.active_count() == 1, f"threads before fork: {threading.enumerate()}"
    return base


def exit_code(e: SystemExit) -> int:
    """The status `python` exits with for this SystemExit."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    print(e.code, file=sys.stderr)
    return 1


def run_program(argv: list[str], base_path: list[str]) -> int:
    """Runs argv[1:] as `python` would in this (forked) process; returns its exit status."""
    try:
        pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if argv[1] == "-c":
            sys.argv = ["-c", *argv[3:]]
            sys.path[:] = ["", *pythonpath, *base_path]
            main = types.ModuleType("__main__")  # a fresh one: this script's stays as it is
            main.__dict__["__builtins__"] = builtins
            sys.modules["__main__"] = main
            exec(compile(argv[2], "<string>", "exec"), main.__dict__)
        elif argv[1] == "-m":
            sys.argv = [argv[2], *argv[3:]]
            sys.path[:] = [os.getcwd(), *pythonpath, *base_path]
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(argv[1])
            sys.argv = [argv[1], *argv[2:]]
            sys.path[:] = [os.path.dirname(script), *pythonpath, *base_path]
            runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as e:
        return exit_code(e)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # as python does: killed by SIGINT
        return 1
    except BaseException:  # noqa: BLE001 - printed as python prints it, status 1
        sys.excepthook(*sys.exc_info())
        return 1


def finish(code: int) -> None:
    """Ends as the interpreter ends: non-daemon threads joined, atexit callbacks, streams flushed."""
    try:
        threading._shutdown()
    except BaseException:  # noqa: BLE001
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a closed pipe, as at a real exit
            pass
    os._exit(code)


def child(request: dict, fds: list[int], base_path: list[str], default_threads: int, set_up: int) -> None:
    """In the forked process: becomes the program and never returns. Writes to `set_up` once its
    session, streams, folder and environment are in place (the caller gets the pid only then,
    as subprocess.Popen returns only after the child's exec)."""
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if request["session"]:
        os.setsid()
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    if request["cwd"]:
        os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.write(set_up, b"1")
    os.close(set_up)
    if os.environ.get("PYTHONUNBUFFERED"):  # as `python -u`
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(write_through=True)
    import torch
    threads = os.environ.get("OMP_NUM_THREADS", "")
    torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0 else default_threads)
    finish(run_program(request["argv"], base_path))


def receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    size = int.from_bytes(data[:8], "little")
    data = data[8:]
    while len(data) < size:
        more = conn.recv(size - len(data))
        if not more:
            raise EOFError("the request ended early")
        data += more
    return json.loads(data), list(fds)


def serve(path: str, base_path: list[str]) -> None:
    import torch
    default_threads = torch.get_num_threads()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    waiting: dict[int, socket.socket] = {}
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "reap")
    sel.register(sys.stdin, selectors.EVENT_READ, "parent")
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            if key.data == "parent" and not os.read(sys.stdin.fileno(), 4096):
                return  # the test process is gone
            if key.data == "reap":
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
                while waiting:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    conn = waiting.pop(pid, None)
                    if conn is not None:
                        try:
                            conn.sendall(f"status {status}\n".encode())
                        except OSError:
                            pass
                        conn.close()
            if key.data == "accept":
                conn, _ = listener.accept()
                request, fds = receive(conn)
                sys.stdout.flush()
                sys.stderr.flush()
                ready_r, ready_w = os.pipe()
                pid = os.fork()
                if pid == 0:
                    try:
                        listener.close()
                        conn.close()
                        for other in waiting.values():
                            other.close()
                        os.close(wake_r)
                        os.close(wake_w)
                        os.close(ready_r)
                        child(request, fds, base_path, default_threads, ready_w)
                    finally:
                        os._exit(70)
                os.close(ready_w)
                os.read(ready_r, 1)  # set up (or dead: then the status follows)
                os.close(ready_r)
                for fd in fds:
                    os.close(fd)
                waiting[pid] = conn
                conn.sendall(f"pid {pid}\n".encode())


def main() -> None:
    path, modules = sys.argv[1], [m for m in sys.argv[2].split(",") if m]
    base_path = preload(modules)
    serve(path, base_path)


if __name__ == "__main__":
    main()
