"""O_DIRECT, as docs/design.md says: a default checkpoint on a filesystem that takes O_DIRECT is
written with it (its data never enters the page cache, and stats count it); where the
filesystem refuses O_DIRECT the checkpoint is written buffered, counted in
stats['o_direct_refused'] and warned about once (on the caller's thread, by the next save,
wait or close), and it loads as any other."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import fastckpt
from fastckpt.store import ahead
from support.page_cache import memory_filesystem, resident_fraction
from support.paths import ROOT, python_path


@pytest.fixture
def disk_dir(tmp_path):
    """tmp_path, where it is on a disk filesystem: on tmpfs every page is resident whatever the
    write (and before Linux 6.6 O_DIRECT is refused there), so these checks mean nothing."""
    kind = memory_filesystem(tmp_path)
    if kind:
        pytest.skip(f"{tmp_path} is on {kind}: its pages stay in memory whatever the write")
    return tmp_path


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(4 << 20, generator=g), "b": torch.randn(1000, generator=g), "step": seed}


def _files(root) -> list[str]:
    """Every checkpoint's part file under root (not the next one, made ahead: store.ahead)."""
    return [os.path.join(d, f) for d, _, names in os.walk(root) for f in names
            if f.startswith("rank-") and os.path.basename(d) != ahead.FOLDER]


def test_a_default_checkpoint_is_written_with_o_direct(disk_dir):
    with fastckpt.Checkpointer(str(disk_dir / "ck")) as ck:
        ck.save(_state(1), step=1).wait()
        assert ck.stats["o_direct"] == 1 and ck.stats["o_direct_refused"] == 0
        path, = _files(disk_dir / "ck")
        # 16 MiB of data went around the page cache; what is left there is the header and the tail
        assert resident_fraction(path) < 0.1, resident_fraction(path)
        assert torch.equal(ck.load()["w"], _state(1)["w"])


def test_direct_io_false_writes_through_the_page_cache(disk_dir):
    with fastckpt.Checkpointer(str(disk_dir / "ck"), direct_io=False) as ck:
        ck.save(_state(1), step=1).wait()
        assert ck.stats["o_direct"] == 0 and ck.stats["o_direct_refused"] == 0
        path, = _files(disk_dir / "ck")
        assert resident_fraction(path) > 0.9


REFUSED = """
import json, sys, warnings
import torch, fastckpt
def _state(seed):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(4 << 20, generator=g), "step": seed}
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as seen:
    with fastckpt.Checkpointer(sys.argv[1], keep=3) as ck:
        for step in (1, 2, 3):
            ck.save(_state(step), step=step).wait()
        stats = dict(ck.stats)
        ok = torch.equal(ck.load()["w"], _state(3)["w"])
print(json.dumps({"stats": stats, "ok": ok, "warnings": [str(w.message) for w in seen]}))
"""


def test_a_filesystem_that_refuses_o_direct_is_counted_and_warned_about_once(disk_dir, fault_shim):
    root = disk_dir / "nodirect"
    env = dict(os.environ, LD_PRELOAD=fault_shim, FASTCKPT_FAULT_PATH=str(root), FASTCKPT_FAULT_NO_DIRECT="1",
               PYTHONPATH=python_path(ROOT))
    r = subprocess.run([sys.executable, "-c", REFUSED, str(root)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["ok"] and got["stats"]["o_direct"] == 0 and got["stats"]["o_direct_refused"] == 3
    said = [w for w in got["warnings"] if "O_DIRECT" in w]
    assert len(said) == 1 and f"the filesystem of {root}" in said[0] and "refused O_DIRECT" in said[0], said
    files = _files(root)
    assert len(files) == 3  # keep=3
    for path in files:  # written buffered: the data is in the page cache
        assert resident_fraction(path) > 0.9
