"""Python programs a test starts, forked from a warm interpreter instead of started cold.

A cold `python` that imports torch spends 2-3 s of CPU before its first line of work, lightning
another 4, and the suite starts a few hundred such processes on 2 cores. `popen()` and `run()` take
what `subprocess.Popen` / `subprocess.run` take for `[sys.executable, ...]` and hand the program to
tests/support/warm_server.py, which imported torch (and `preload`) once and forks a real process
for it: its own pid, real signals and kill -9, stdin/stdout/stderr, environment, working directory,
process group, sys.argv and sys.path as a cold start sets them (warm_server.py says what it sets).

A cold start is used instead where a warm one would differ: another interpreter, an LD_PRELOAD
shim that keeps state from the first instruction (the fault shim, which reads its settings at each
call, gets a warm interpreter started with it), Python's start-up options or variables, a CUDA
device, or FASTCKPT_TEST_COLD=1 in the test's environment (to compare). Import-time settings of the
preloaded libraries (OMP_*, MKL_*, DS_*, TORCH_*, ...) select a warm interpreter started with the
same values. One warm interpreter per (preload, settings) and test process, ended with it.
"""
from __future__ import annotations

import atexit
import functools
import io
import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time

from .paths import ROOT

SERVER = os.path.join(ROOT, "tests", "support", "warm_server.py")
# read by the preloaded libraries when they are imported: a warm interpreter is started with the
# child's values (OMP_NUM_THREADS is applied in the child itself)
IMPORT_TIME = ("OMP_", "MKL_", "KMP_", "GOMP_", "DS_", "CUDA", "NCCL_", "TORCH", "PYTORCH_", "ATEN_", "DNNL_",
               "ONEDNN_", "LIGHTNING_", "PL_", "NVIDIA_")
APPLIED_IN_CHILD = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
# read only when an interpreter starts: a program given any of them (other than the test's own
# values) starts cold
STARTUP_ONLY = ("LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONWARNINGS", "PYTHONHASHSEED", "PYTHONFAULTHANDLER",
                "PYTHONMALLOC", "PYTHONDEVMODE", "PYTHONOPTIMIZE", "PYTHONSAFEPATH",
                "PYTHONNOUSERSITE", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONINSPECT", "PYTHONTRACEMALLOC",
                "PYTHONPROFILEIMPORTTIME", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING", "PYTHONUTF8")
# (PYTHONUNBUFFERED is applied in the child: its stdout and stderr write through)
# preloaded libraries a warm interpreter may be started with, its children inheriting them: each
# reads its settings from the environment at every call (the child's own), and its counters are
# still zero at fork (the interpreter touched no path it watches). Any other LD_PRELOAD: cold.
FORK_SAFE_SHIMS = ("eio_shim.so",)
# what each preload name imports: the libraries and the parts of them most programs here reach
# (torch._inductor.config: torch.use_deterministic_algorithms, which fastckpt.reproducible calls,
# imports it, 2 s; DeepSpeed's ZeRO optimizer check imports its Muon optimizer, which imports dynamo)
MODULES = {"torch": ("torch", "torch._inductor.config", "torch.distributed", "numpy"),
           "deepspeed": ("deepspeed", "deepspeed.runtime.zero.muon.muon_optimizer"),
           "lightning": ("lightning", "lightning.pytorch")}
_servers: dict[tuple, "_Server"] = {}


@functools.cache
def _has_cuda() -> bool:
    """On a GPU machine every program starts cold: a CUDA driver set up before fork (DeepSpeed's
    accelerator probe may do it at import) is unusable in the children."""
    import torch
    return torch.cuda.is_available()


def _warm_key(argv, env: dict, preload: tuple[str, ...]):
    """The warm interpreter for this program, or None where it must start cold."""
    if os.environ.get("FASTCKPT_TEST_COLD") == "1" or env.get("FASTCKPT_TEST_COLD") == "1" or _has_cuda():
        return None
    if not argv or os.fspath(argv[0]) != sys.executable or len(argv) < 2:
        return None
    first = os.fspath(argv[1])
    if first.startswith("-") and first not in ("-c", "-m") or first in ("-c", "-m") and len(argv) < 3:
        return None
    if any((env.get(k) or None) != (os.environ.get(k) or None) for k in STARTUP_ONLY if k != "LD_PRELOAD"):
        return None
    shims = env.get("LD_PRELOAD", "").replace(":", " ").split()
    if any(os.path.basename(shim) not in FORK_SAFE_SHIMS for shim in shims):
        return None
    settings = tuple(sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_TIME) and k not in APPLIED_IN_CHILD
                            or k == "LD_PRELOAD" and shims))
    return tuple(sorted(set(preload) | {"torch"})), settings


class _Server:
    """One warm interpreter: started once, asked for children over its unix socket."""

    def __init__(self, preload: tuple[str, ...], settings: tuple):
        modules = [m for name in preload for m in MODULES.get(name, (name,))]
        self.folder = tempfile.mkdtemp(prefix="fastckpt-warm-")
        self.path = os.path.join(self.folder, "socket")
        env = {k: v for k, v in os.environ.items() if not k.startswith(IMPORT_TIME) or k in APPLIED_IN_CHILD}
        env.update(settings)
        env.pop("PYTHONPATH", None)
        self.proc = subprocess.Popen([sys.executable, SERVER, self.path, ",".join(modules)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.proc.kill()
            raise RuntimeError(f"the warm interpreter did not start (it said {line!r}; status {self.proc.wait()})")

    def start(self, argv: list[str], env: dict, cwd, session: bool, fds: list[int]) -> tuple[socket.socket, int]:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        # the test's own folder by default, as Popen gives it (the test may have changed folder
        # since the warm interpreter started)
        body = json.dumps({"argv": argv, "env": env, "cwd": os.path.abspath(os.fspath(cwd) if cwd else os.getcwd()),
                           "session": session}).encode()
        socket.send_fds(conn, [len(body).to_bytes(8, "little") + body[:32768]], fds)
        if len(body) > 32768:
            conn.sendall(body[32768:])
        answer = b""
        while not answer.endswith(b"\n"):
            more = conn.recv(1)
            if not more:
                raise RuntimeError("the warm interpreter closed the connection before starting the program")
            answer += more
        word, pid = answer.decode().split()
        assert word == "pid", answer
        return conn, int(pid)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        try:
            os.unlink(self.path)
            os.rmdir(self.folder)
        except OSError:
            pass


_starting = threading.Lock()  # tests start ranks from threads too


def _server(key) -> _Server:
    with _starting:
        if key not in _servers:
            _servers[key] = _Server(*key)
        return _servers[key]


@atexit.register
def _close_all() -> None:
    for server in _servers.values():
        server.close()
    _servers.clear()


def _end(spec, target: int):
    """One standard stream of the child (`target`: 0, 1 or 2): the fd the child gets, and the end
    the test reads or writes (None unless PIPE)."""
    mode = "r" if target == 0 else "w"
    if spec is None:
        return os.dup(target), None
    if spec == subprocess.DEVNULL:
        return os.open(os.devnull, os.O_RDWR), None
    if spec == subprocess.PIPE:
        r, w = os.pipe()
        child, mine = (r, w) if mode == "r" else (w, r)
        return child, mine
    fd = spec if isinstance(spec, int) else spec.fileno()
    return os.dup(fd), None


class WarmProcess:
    """What subprocess.Popen offers a test, for a program the warm interpreter forked."""

    def __init__(self, args, *, env=None, cwd=None, stdin=None, stdout=None, stderr=None, text=False,
                 universal_newlines=None, start_new_session=False, preload: tuple[str, ...] = (), _key=None):
        self.args = [os.fspath(a) for a in args]
        self.returncode = None
        text = bool(text or universal_newlines)
        env = dict(os.environ if env is None else env)
        in_fd, in_mine = _end(stdin, 0)
        out_fd, out_mine = _end(stdout, 1)
        if stderr == subprocess.STDOUT:
            err_fd, err_mine = os.dup(out_fd), None
        else:
            err_fd, err_mine = _end(stderr, 2)
        children = [in_fd, out_fd, err_fd]
        try:
            self._conn, self.pid = _server(_key).start(self.args, env, cwd, start_new_session, children)
        finally:
            for fd in children:
                os.close(fd)
        self.stdin = self._file(in_mine, "wb", text)
        self.stdout = self._file(out_mine, "rb", text)
        self.stderr = self._file(err_mine, "rb", text)
        self._text = text
        self._got = {}

    @staticmethod
    def _file(fd, mode, text):
        if fd is None:
            return None
        f = open(fd, mode, buffering=-1 if mode == "rb" else 0)
        if text:
            return io.TextIOWrapper(f if mode == "rb" else io.BufferedWriter(f), write_through=True)
        return f

    # -- the end of the child --------------------------------------------------------
    def _read_status(self, timeout) -> bool:
        if self.returncode is not None:
            return True
        self._conn.settimeout(timeout)
        data = b""
        try:
            while not data.endswith(b"\n"):
                more = self._conn.recv(64)
                if not more:
                    raise RuntimeError(f"the warm interpreter ended before program {self.args[1:3]} did")
                data += more
        except (socket.timeout, BlockingIOError):
            if data:  # a partial answer: wait for the rest
                self._conn.settimeout(None)
                while not data.endswith(b"\n"):
                    data += self._conn.recv(64)
            else:
                return False
        word, status = data.decode().split()
        assert word == "status", data
        self.returncode = os.waitstatus_to_exitcode(int(status))
        self._conn.close()
        return True

    def poll(self):
        self._read_status(0)
        return self.returncode

    def wait(self, timeout=None):
        if not self._read_status(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(9)

    def terminate(self) -> None:
        self.send_signal(15)

    # -- its output ------------------------------------------------------------------
    def communicate(self, input=None, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.stdin is not None:
            if input:
                self.stdin.write(input)
            self.stdin.close()
            self.stdin = None
        sel = selectors.DefaultSelector()
        for name in ("stdout", "stderr"):
            f = getattr(self, name)
            if f is not None and not f.closed:
                self._got.setdefault(name, [])
                raw = f.buffer if self._text else f
                os.set_blocking(raw.fileno(), False)
                sel.register(raw.fileno(), selectors.EVENT_READ, name)
        while sel.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                sel.close()
                raise subprocess.TimeoutExpired(self.args, timeout)
            for key, _ in sel.select(left):
                try:
                    chunk = os.read(key.fd, 1 << 16)
                except BlockingIOError:
                    continue
                if chunk:
                    self._got[key.data].append(chunk)
                else:
                    sel.unregister(key.fd)
                    getattr(self, key.data).close()
        sel.close()
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        self.wait(left)
        out = [self._collected(name) for name in ("stdout", "stderr")]
        return out[0], out[1]

    def _collected(self, name):
        if name not in self._got:
            return None
        data = b"".join(self._got[name])
        return data.decode() if self._text else data

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for f in (self.stdout, self.stderr, self.stdin):
            if f is not None and not f.closed:
                f.close()
        self.wait()


def popen(args, *, preload: tuple[str, ...] = (), **kw):
    """subprocess.Popen(args, **kw), warm where it can be (see the module's docstring)."""
    env = kw.get("env")
    key = _warm_key(args, dict(os.environ if env is None else env), preload)
    if key is None:
        return subprocess.Popen(args, **kw)
    return WarmProcess(args, preload=preload, _key=key, **kw)


def run(args, *, preload: tuple[str, ...] = (), timeout=None, check=False, capture_output=False, input=None,
        **kw) -> subprocess.CompletedProcess:
    """subprocess.run(args, ...), warm where it can be."""
    if capture_output:
        kw["stdout"] = kw["stderr"] = subprocess.PIPE
    if input is not None:
        kw["stdin"] = subprocess.PIPE
    proc = popen(args, preload=preload, **kw)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done
