"""Plugins only adapt: importing and using lightning_fastckpt and deepspeed_fastckpt changes no
class of Lightning and none of DeepSpeed's beyond the few below, each with the reason no hook of
DeepSpeed's serves (the rest goes through the frameworks' own hooks: the engine's module forward
hooks, Lightning's callbacks_factory entry point, the strategy's public checkpoint_io).

The walk (tests/workers/class_walk.py) runs in its own interpreter: a Lightning Trainer with
FastCheckpointIO, a Lightning Trainer driving a DeepSpeed engine, and a DeepSpeed engine with
activation offload and interval, each saving; every class __dict__ compared before and after."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from support import warm

WORKER = os.path.join(os.path.dirname(__file__), "..", "workers", "class_walk.py")

ALLOWED = {
    "deepspeed.runtime.engine.DeepSpeedEngine._configure_checkpointing":
        "DeepSpeed builds its checkpoint engine there from the JSON config and offers no hook to choose it",
    "deepspeed.runtime.engine.DeepSpeedEngine.load_checkpoint":
        "DeepSpeed reads `latest` itself before it calls the checkpoint engine at all: a save still in flight "
        "or a `latest` naming a tag a crash cut short could only be refused, not waited for or fallen back from",
    "deepspeed.runtime.engine.DeepSpeedEngine.destroy":
        "DeepSpeed calls checkpoint_engine.cleanup() only for a decoupled engine, and only after it destroyed "
        "the optimizer whose tensors a save may still be copying",
    "deepspeed.checkpoint.deepspeed_checkpoint.DeepSpeedCheckpoint.__init__":
        "DeepSpeed's offline readers call no checkpoint engine; run in-process after save_checkpoint "
        "(DeepSpeed's own universal-checkpoint tests do) they would read a tag still landing",
    "deepspeed.checkpoint.ds_to_universal._get_optim_files": "as DeepSpeedCheckpoint.__init__",
    "deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint": "as DeepSpeedCheckpoint.__init__",
}


def test_no_framework_class_changes_but_the_ones_deepspeed_gives_no_hook_for(tmp_path):
    out = tmp_path / "walk.json"
    done = subprocess.run([sys.executable, WORKER, str(tmp_path), str(out)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    walk = json.loads(out.read_text())
    assert walk["planted"] == ["lightning.pytorch.strategies.fsdp.FSDPStrategy.save_checkpoint"]  # it sees one
    assert not [k for k in walk["changed"] if k.startswith("lightning.")], walk["changed"]
    assert sorted(walk["changed"]) == sorted(ALLOWED), walk["changed"]


WHICH_CALLBACKS = """
import gc
import json
import logging
import lightning as L
said = []
class Said(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())
logging.getLogger("lightning.fabric.utilities.registry").addHandler(Said())
logging.getLogger("lightning.fabric.utilities.registry").setLevel(logging.INFO)
def names(**kw):
    said.clear()
    t = L.Trainer(logger=False, enable_progress_bar=False, **kw)
    return json.dumps([[type(c).__name__ for c in t.callbacks], [m for m in said if "entry point" in m]])
print(names())
import lightning_fastckpt
print(names())
import fastckpt
from lightning_fastckpt import FastCheckpointIO, PreemptCheckpoint
print(names(callbacks=[PreemptCheckpoint(dirpath="ck")]))  # fastckpt imported, neither IO nor DeepSpeed used
io = FastCheckpointIO()
print(names(plugins=[io]))
del io
gc.collect()
print(names())
import deepspeed_fastckpt
print(names())
"""


def test_lightning_adds_the_watch_only_to_trainers_it_concerns():
    """Only while a FastCheckpointIO exists, or once the DeepSpeed plugin is imported: a Trainer
    of a process that merely imported fastckpt gets no callback and no log line (issue 65)."""
    done = warm.run([sys.executable, "-c", WHICH_CALLBACKS], capture_output=True, text=True, timeout=300,
                    preload=("lightning",))
    assert done.returncode == 0, done.stderr[-3000:]
    alone, package_only, imported, with_io, io_gone, deepspeed = [json.loads(line) for line in
                                                                   done.stdout.splitlines()[-6:]]
    for callbacks, logged in (alone, package_only, imported, io_gone):
        assert "FastckptWatch" not in callbacks and logged == [], (callbacks, logged)
    for callbacks, logged in (with_io, deepspeed):
        assert callbacks.count("FastckptWatch") == 1 and len(logged) == 1, (callbacks, logged)
