"""fastckpt.host_hooks: what a plugin declares for its framework when that framework drives
another plugin's engine (Lightning's DeepSpeedStrategy over DeepSpeed's engine). The core runs
each installed hook once it took (a hook of a framework not imported yet runs again later), a
broken one is said and left out, one whose framework is absent is left out quietly. Lightning's
hook is declared and wraps DeepSpeedStrategy.remove_checkpoint only once Lightning is imported:
a removal of a folder with a set in flight is withdrawn (deleted once it lands), any other is
Lightning's own. The whole run of it under a real Trainer: tests/deepspeed_fastckpt/test_deepspeed.py
::test_lightning_top_k_removes_a_checkpoint_still_in_flight_once_it_lands."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from fastckpt import host_hooks
from fastckpt.commit.agreement import Agreement
from fastckpt.commit.file_sets import FileSets, withdraw_anywhere
from fastckpt.pending import Pending
from fastckpt.write.deadline import Deadline
from support.paths import ROOT, python_path


class Hook:
    def __init__(self, name, result):
        self.name, self.value, self.result, self.calls = name, f"plugin_{name}:install", result, 0

    def load(self):
        def install():
            self.calls += 1
            if isinstance(self.result, BaseException):
                raise self.result
            return self.result
        return install


def test_each_hook_runs_until_it_took_and_a_broken_one_is_said(monkeypatch, caplog):
    took, later = Hook("took", True), Hook("later", False)
    broken, absent = Hook("broken", RuntimeError("cannot wrap")), Hook("absent", ImportError("no framework"))
    monkeypatch.setattr(host_hooks, "entry_points", lambda group: [took, later, broken, absent])
    monkeypatch.setattr(host_hooks, "_done", set())
    with caplog.at_level(logging.WARNING, logger="fastckpt"):
        host_hooks.install()
        host_hooks.install()
    assert (took.calls, later.calls, broken.calls, absent.calls) == (1, 2, 1, 1)
    assert "broken" in caplog.text and "cannot wrap" in caplog.text and "absent" not in caplog.text


def test_withdraw_anywhere_asks_every_file_sets_of_the_process(tmp_path):
    owner = tmp_path / "epoch=0.ckpt"
    held = Pending(1, 1)
    first, second = (FileSets("r.json", Agreement(), Deadline(60.0), 0.0) for _ in range(2))
    second.submit(str(owner / "checkpoint"), [(str(owner / "checkpoint" / "x.pt"), held)], step=1)
    assert not withdraw_anywhere(str(tmp_path / "other"))
    assert withdraw_anywhere(str(owner)) and second.is_withdrawn(str(owner)) and not first.is_withdrawn(str(owner))
    (owner / "checkpoint").mkdir(parents=True)
    held.settle(None, OSError("removed under it"))
    second.wait()
    assert not owner.exists()


PROBE = r"""
import json, sys
from fastckpt import host_hooks
import lightning_fastckpt.deepspeed_removal
said = {"lightning_after_hook_import": "lightning" in sys.modules}
host_hooks.install()
said["lightning_after_install"] = "lightning" in sys.modules
from lightning.pytorch.strategies.deepspeed import DeepSpeedStrategy
from lightning.pytorch.plugins.io import TorchCheckpointIO
import types, pathlib, threading
from fastckpt.commit.agreement import Agreement
from fastckpt.commit.file_sets import FileSets
from fastckpt.pending import Pending
from fastckpt.write.deadline import Deadline
before = DeepSpeedStrategy.remove_checkpoint
host_hooks.install()
said["wrapped"] = DeepSpeedStrategy.remove_checkpoint is not before
root = pathlib.Path(sys.argv[1])
strategy = types.SimpleNamespace(is_global_zero=True, checkpoint_io=TorchCheckpointIO())
plain, busy = root / "plain.ckpt", root / "busy.ckpt"
for d in (plain, busy):
    (d / "checkpoint").mkdir(parents=True)
held = Pending(1, 1)
sets = FileSets("r.json", Agreement(), Deadline(60.0), 0.0)
sets.submit(str(busy / "checkpoint"), [(str(busy / "checkpoint" / "x.pt"), held)], step=1)
DeepSpeedStrategy.remove_checkpoint(strategy, str(plain))
DeepSpeedStrategy.remove_checkpoint(strategy, str(busy))
said["plain_removed_at_once"] = not plain.exists()
said["busy_kept_while_in_flight"] = busy.exists()
held.settle(None, OSError("removed under it"))
sets.wait()
said["busy_removed_once_landed"] = not busy.exists()
print(json.dumps(said))
"""


def test_lightnings_hook_is_declared_imports_nothing_and_withdraws_a_folder_in_flight(tmp_path):
    pytest.importorskip("lightning")
    env = dict(os.environ, PYTHONPATH=python_path())
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert said == {"lightning_after_hook_import": False, "lightning_after_install": False, "wrapped": True,
                    "plain_removed_at_once": True, "busy_kept_while_in_flight": True,
                    "busy_removed_once_landed": True}, said
