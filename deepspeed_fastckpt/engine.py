"""FastckptEngine: DeepSpeed's CheckpointEngine over fastckpt's asynchronous Checkpointer.

Owns the mapping from DeepSpeed's calls to fastckpt:
- `create(info)` opens a tag; every `save(state_dict, path)` is one asynchronous fastckpt
  file written at exactly `path` (an ordinary torch.save-format file that `torch.load` and
  `zero_to_fp32` read), durable and renamed into place on its own;
- `commit(info)` hands the tag to the TagCommitter, which records it once every rank's
  files are durable; it does not block, so `engine.save_checkpoint` returns once the
  snapshots are issued;
- consistency: tensors that only the optimizer update writes (the optimizer's own
  parameters and state, and the module parameters outside ZeRO-3, which DeepSpeed
  rewrites only after that update) are copied in the background, and each group's
  update waits for that group's copies (group_gate); every other tensor is copied
  before save returns;
- a save_dir removed while its tags are in flight (Lightning's ModelCheckpoint, through
  deepspeed_fastckpt.lightning_removal) is deleted once they land, and not committed;
- `load(path)` waits for that path if it is in flight and reads with fastckpt's
  restricted unpickler, which accepts the DeepSpeed types listed in
  fastckpt.store.deepspeed_types and never runs code from the file;
- errors of a background write are raised by the next `create`, by `wait()` and by `close()`
  (with `"on_error": "warn"` they are logged and warned about instead, and training goes on);
- with `"pool": ...` in the entry the files are models of a persistent-memory pool named by
  their paths (fastckpt's pmem store). Once a file's version is current in the pool, a small
  pointer file is written at its path, so that DeepSpeed's own globbing and existence checks
  see the tag as it is; the tag records stay files in save_dir as well.
"""
from __future__ import annotations

import atexit
import logging
import os
import weakref
from typing import Optional

import torch
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointCommitInfo, CheckpointEngine

from fastckpt.commit.agreement import make_agreement
from fastckpt.named import NamedCheckpoints
from fastckpt.store.tag_records import mark_open
from fastckpt.write.gate import StepGate

from .group_gate import GroupGate
from fastckpt.store.deepspeed_types import deepspeed_safe_globals
from .settings import checkpointer_kwargs, entry_of
from .load_tag import Choice, agreed_choice
from .tags import TagCommitter

ENGINE_NAME = "FastckptEngine"
log = logging.getLogger(__name__)
_open_engines: "weakref.WeakSet[FastckptEngine]" = weakref.WeakSet()


class FastckptEngine(CheckpointEngine):
    """Selected by a "fastckpt" entry in the DeepSpeed config once `deepspeed_fastckpt` is imported."""

    def __init__(self, config_params=None, settings: Optional[dict] = None):
        super().__init__(config_params)
        self.name = ENGINE_NAME
        kwargs = checkpointer_kwargs(settings if settings is not None else entry_of(config_params))
        self.verify = kwargs.get("verify", True)
        self.pool = kwargs.pop("pool", None)
        self.named = NamedCheckpoints(kwargs, pool=self.pool, distributed=False, pool_pointers=True)
        self._committer = TagCommitter(make_agreement(kwargs.get("commit_timeout_s", 600.0)),
                                       on_durable=self.named.leave_pointer if self.pool else None,
                                       report=lambda e: self.named.checkpointer.report_failure(e))
        self._files: list = []
        self.update_only: frozenset = frozenset()  # storages only the update writes; set by configure()
        self.group_gate = GroupGate(self.named.checkpointer)
        self.gate = StepGate(self._before_update, scoped=True)
        self.gate.install()
        self._closed = False
        _open_engines.add(self)

    def _before_update(self, optimizer) -> None:
        """Before each optimizer.step DeepSpeed makes: the per-group gate; at the second step
        (optimizer state exists by then) staging is faulted in for the first save, in the
        background."""
        self.group_gate(optimizer)
        if self.gate.steps_seen == 2:
            self.named.reserve(self.gate.owned_bytes(), self.gate.owned_device())

    def configure(self, ds_optimizer, module_params: frozenset) -> None:
        """Once DeepSpeed built its optimizer: the tensors only the update rewrites beyond the
        torch optimizer's own (the module parameters outside ZeRO-3, which re-gathers them in
        forward), and the per-group gate."""
        self.group_gate.configure(ds_optimizer, module_params)
        self.update_only = module_params

    # -- saving ----------------------------------------------------------
    def create(self, info: CheckpointCommitInfo) -> None:
        self._committer.raise_errors()
        if self._committer.is_withdrawn(info.save_dir):  # saved again after its removal: removed first
            self._committer.wait_for(info.save_dir)
        self._files = []
        mark_open(info.save_dir, info.tag)

    def save(self, state_dict, path: str) -> None:
        path = os.path.abspath(path)
        view = self.gate.snapshot_view(state_dict, also_owned=self.update_only)
        pending = self.named.save(view.state, path, step=self.gate.steps_seen, watch=view.watch)
        self._files.append((path, pending))
        if self.gate.steps_seen == 0:  # before any optimizer step nothing gates the copy: finish it now
            pending.wait()
        elif view.copy_now:  # until the run has shown only the update writes these tensors
            pending.release_all()
            pending.wait_copied()

    def commit(self, info: CheckpointCommitInfo) -> bool:
        files, self._files = self._files, []
        self._committer.submit(info.save_dir, info.tag, files)
        self.named.forget_landed()
        return True

    def in_flight(self) -> int:
        """Files saved and not yet durable on this rank."""
        return len(self.named.in_flight())

    def wait(self) -> None:
        """Until every tag saved so far is committed on every rank; raises the first error."""
        self.named.wait()
        self._committer.wait()

    def reconfigure(self, concurrency: Optional[int] = None, writers: Optional[int] = None) -> None:
        """New concurrency / writers (the tuner's N*, p*): every tag in flight commits first."""
        self.wait()
        self.named.reconfigure(concurrency=concurrency, writers=writers)
        self.group_gate.retarget(self.named.checkpointer)

    # -- loading ---------------------------------------------------------
    def load(self, path: str, map_location=None):
        if self.pool and callable(map_location):  # DeepSpeed's map_location callables keep storages on the CPU
            map_location = None
        with torch.serialization.safe_globals(deepspeed_safe_globals()):
            return self.named.load(path, map_location, self.verify, mmap=False)

    def size_of(self, path: str) -> Optional[int]:
        """Bytes of what was saved at path: the file, or the pool's current version of it."""
        return self.named.size(path)

    def tag_to_load(self, load_dir: str, tag=None, latest_file: str = "latest") -> Choice:
        """The tag every rank loads from load_dir (load_tag.choose), once every save of this
        process into load_dir has landed — this engine's and any other engine's still open.
        The ranks agree on it (load_tag.agreed_choice)."""
        self.wait()
        wait_for_saves_into(load_dir)
        return agreed_choice(self._committer.agreement, load_dir, tag, self.size_of, latest_file)

    # -- closing ---------------------------------------------------------
    def cleanup(self) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _open_engines.discard(self)
        self.gate.remove()
        try:
            self.named.close()
        finally:
            self._committer.close()



def wait_for_saves_into(save_dir: str) -> None:
    """Until every save of this process into save_dir has committed or failed (any open engine's)."""
    for engine in list(_open_engines):
        engine._committer.wait_for(save_dir)


def withdraw_saves_into(save_dir: str) -> bool:
    """save_dir is being removed: True if a save of this process into it is still in flight,
    and then it is deleted (and not committed) once those land; False if the caller deletes it."""
    withdrawn = [engine._committer.withdraw(save_dir) for engine in list(_open_engines)]
    return any(withdrawn)


@atexit.register
def _close_at_exit() -> None:
    """A script that ends without engine.destroy(): the last tags still land and commit."""
    for engine in list(_open_engines):
        try:
            engine.close()
        except Exception as e:  # noqa: BLE001 - nobody is left to raise to
            log.error("fastckpt: a DeepSpeed checkpoint did not complete at exit: %s", e)
