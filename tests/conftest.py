"""Fixtures and hooks for every test: --many, GPU skips, a per-session torch extensions folder,
/dev/shm and tmpfs folders, the fault shim. Shared helpers are in tests/support/, the programs
tests run in tests/workers/."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid

import pytest
import torch
from support.paths import ROOT, WORKERS

if WORKERS not in sys.path:  # the test programs import their siblings by name, as when run (one_line, lit_app)
    sys.path.append(WORKERS)

pytest_plugins = ["crashsim.fixtures"]  # shim and work, for the power-loss tests


def pytest_addoption(parser):
    parser.addoption("--many", action="store_true", default=False,
                     help="run the long crash campaigns (1000 kills) instead of the CI-sized ones")


@pytest.fixture
def many(request) -> bool:
    return request.config.getoption("--many")


def pytest_configure(config):
    """The math library warmed up before any test trains (tests compare runs in this process bit
    for bit, and a process's first vector-math call is not reproducible: fastckpt.reproducible).

    Torch extensions JIT-built during this session go to a directory of its own. torch guards a
    build with a bare lock file; a process killed while holding it (a child killed by a deadline, a
    kill -9 test) leaves the file behind, and every later DeepSpeed start in any run sharing the
    directory waits on it forever. The ops DeepSpeed needs on the CPU are prebuilt at install (see
    the Makefile), so normally nothing is built here at all."""
    import fastckpt
    fastckpt.reproducible(deterministic=False)
    if "TORCH_EXTENSIONS_DIR" not in os.environ:
        config._fastckpt_extensions = os.environ["TORCH_EXTENSIONS_DIR"] = tempfile.mkdtemp(prefix="fastckpt-torch-ext-")


def pytest_unconfigure(config):
    """The session's own extensions folder goes with it."""
    made = getattr(config, "_fastckpt_extensions", None)
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)


# The slow tier, by test id prefix: what starts ranks, frameworks, kill campaigns or whole programs.
# `make test-quick` runs everything else (-m "not slow", the edit loop); `make test` runs all.
SLOW = ("tests/benchmarks/test_bench_gpu_overhead.py::test_make_gpu_check", "tests/campaign/", "tests/crashsim/",
        "tests/deepspeed_fastckpt/", "tests/framework_suites/", "tests/native/", "tests/torchtitan_fastckpt/",
        "tests/fastckpt/commit/test_commit_protocol.py", "tests/fastckpt/dcp/test_dcp_storage.py",
        "tests/fastckpt/dcp/test_dcp_tools.py", "tests/fastckpt/dcp/test_fsdp2.py", "tests/fastckpt/dcp/test_stager.py",
        "tests/fastckpt/pmem/test_pmem.py::test_kill9", "tests/fastckpt/test_crash.py",
        "tests/fastckpt/test_distributed.py", "tests/fastckpt/test_reproducibility.py",
        "tests/lightning_fastckpt/test_lightning_ddp.py", "tests/lightning_fastckpt/test_lightning_model_parallel.py",
        "tests/project/test_first_hour.py", "tests/project/test_no_thread_left.py::test_no_thread_outlives_a_destroyed_deepspeed",
        "tests/project/test_run_isolated.py::test_every_test_gets_its_own_line_and_a_hang_is_killed",
        "tests/fastckpt/tools/test_cli_folders.py::test_a_deepspeed", "tests/fastckpt/tools/test_folder_kind_conformance.py",
        "tests/fastckpt/s3/")


# make gpu-check (tests/support/gpu_check.sh) collects only the files that spell this, not the whole
# tree (importing every test module costs ~15 s, of device time there): a gpu test elsewhere is refused
GPU_MARK_TEXT = "mark.gpu"


def pytest_collection_modifyitems(config, items):
    slow = pytest.mark.slow
    for item in items:
        if item.nodeid.startswith(SLOW):
            item.add_marker(slow)
    gpu_files = {str(item.path) for item in items if item.get_closest_marker("gpu") is not None}
    hidden = sorted(f for f in gpu_files if GPU_MARK_TEXT not in open(f, encoding="utf-8").read())
    if hidden:
        raise pytest.UsageError(f"gpu tests in {hidden}, which never spell {GPU_MARK_TEXT!r}: make gpu-check "
                                "finds the gpu tests' files by that text (mark them @pytest.mark.gpu there)")
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def shm():
    """A fresh directory on /dev/shm (memory-backed, where pools live on machines without PMEM)."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here")
    d = os.path.join("/dev/shm", f"fastckpt-test-{uuid.uuid4().hex[:8]}")
    os.makedirs(d)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def mount_tmpfs(tmp_path):
    mounted = []

    def mount(size_bytes: int) -> str:
        d = tmp_path / f"mnt-{uuid.uuid4().hex[:6]}"
        d.mkdir()
        opts = f"size={size_bytes}"
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(d)], capture_output=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
        mounted.append(d)
        return str(d)

    yield mount
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


@pytest.fixture(scope="session")
def fault_shim(tmp_path_factory) -> str:
    """tests/campaign/eio_shim.c built as an LD_PRELOAD library: with FASTCKPT_FAULT_PATH
    and FASTCKPT_FAULT_SLOW_US set, every write and fsync under that path takes that long."""
    src = os.path.join(ROOT, "tests", "campaign", "eio_shim.c")
    so = str(tmp_path_factory.mktemp("shim") / "eio_shim.so")
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", so, src, "-ldl"], check=True, capture_output=True)
    return so


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 server (SeaweedFS, tests/support/s3_server.py) on loopback for this test process,
    with a bucket and credentials; stopped at the end of the session. No `weed` here is an error."""
    from support.s3_server import S3Server
    server = S3Server(str(tmp_path_factory.mktemp("s3"))).start()
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The S3 server, found by this process and the processes it starts the way every AWS tool finds
    one: its endpoint, region and credentials in the environment (no config file of this machine read)."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    return s3_server
