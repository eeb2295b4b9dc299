"""FastckptEngine: DeepSpeed's CheckpointEngine over fastckpt's asynchronous saves.

Owns the mapping from DeepSpeed's calls to fastckpt: `create` opens a tag; each
`save(state_dict, path)` is one asynchronous file at exactly `path` (torch.save format, so
`torch.load` and `zero_to_fp32` read it; with `"pool"` a pool model named by the path, and a
pointer file there); `commit` hands the tag to the ordered commit (tags.py) and does not
block; `load(path)` waits for that path if it is in flight and never runs code from the file
(safe_types lists the DeepSpeed types it accepts). Tensors only the
optimizer update writes are copied in the background and each group's update waits for its
copies (group_gate); every other tensor is copied before save returns. Errors of a background
write are raised by the next `create`, by `wait()` and `close()` (or warned about with
`"on_error": "warn"`). A save_dir removed while in flight: fastckpt.commit.file_sets.withdraw_anywhere.
With a "bucket" in the entry, each tag once committed is uploaded there in the background
(fastckpt.store.s3.folder_mirror), and a load on a node whose save_dir lacks the newest tag the
bucket holds fetches it first (load_tag).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Optional, Union, cast

import torch
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointCommitInfo, CheckpointEngine

from fastckpt.errors import CheckpointWriteError, ConfigError
from fastckpt.session import URL, FolderMirror, PreemptSignal, Remote, TrainingSession

from . import open_engines
from .group_gate import GroupGate
from .safe_types import deepspeed_safe_globals
from .tag_records import mark_open
from .settings import bucket_of, checkpointer_config, entry_of, preempt_of
from .load_tag import Choice, agreed_choice
from .tags import TagCommitter

if TYPE_CHECKING:
    from deepspeed.runtime.config import DeepSpeedConfig
    from torch.serialization import MAP_LOCATION

ENGINE_NAME = "FastckptEngine"


def tag_folder(info: CheckpointCommitInfo) -> str:
    """Where the files of the tag being saved lie: save_dir/tag."""
    return os.path.abspath(os.path.join(info.save_dir, str(info.tag)))


class FastckptEngine(CheckpointEngine):
    """Selected by a "fastckpt" entry in the DeepSpeed config once `deepspeed_fastckpt` is imported."""

    def __init__(self, config_params: Union[DeepSpeedConfig, dict[str, Any], None] = None,
                 settings: Optional[dict] = None) -> None:
        super().__init__(config_params)
        self.name = ENGINE_NAME
        entry = settings if settings is not None else entry_of(config_params)
        config, self.pool = checkpointer_config(entry)
        preempt = preempt_of(entry)  # the handler only notes the signal: at_step_end acts on it
        self.preempt = PreemptSignal(*preempt) if preempt is not None else None
        self.verify = config.verify
        # placed where the entry came in; each rank writes its own files alone (a tag commits across
        # the ranks through the TagCommitter below); each group's update waits for its own copies
        session = TrainingSession(config, own_files=True, pool_pointers=True, scoped=True,
                                  gate=lambda named: GroupGate(named.checkpointer))
        self.named, self.saves = session.named, session
        self.group_gate = cast(GroupGate, session.before_update)
        report = self.named.checkpointer.report_failure
        bucket = bucket_of(entry)
        self.mirror = FolderMirror(bucket[0], Remote.of(config), config, bucket[1], report) if bucket else None
        self.committer = TagCommitter(self.named, report=report,
                                      committed=self.mirror.drain if self.mirror is not None else None,
                                      newest_in_bucket=self.mirror.newest_counter if self.mirror is not None else None)
        self._files: list = []
        self._global_steps = -1  # DeepSpeed's global_steps of the tag being saved (-1: not seen)
        self.update_only: frozenset = frozenset()  # storages only the update writes; set by configure()
        self._tag_dir: Optional[str] = None  # the folder of the tag being saved (create .. commit)
        self._marked = False  # its open mark left (at its first file)
        self._closed = False
        open_engines.opened(self)

    def configure(self, ds_optimizer: object, module_params: frozenset) -> None:
        """Once DeepSpeed built its optimizer: the tensors only the update rewrites beyond the
        torch optimizer's own (the module parameters outside ZeRO-3, which re-gathers them in
        forward), and the per-group gate."""
        self.group_gate.configure(ds_optimizer, module_params)
        self.update_only = module_params

    # -- saving ----------------------------------------------------------
    def makedirs(self, path: Union[str, os.PathLike[str]], exist_ok: bool = False) -> None:
        """DeepSpeed's save_dir made (rank 0 alone, before a barrier); a URL is not made into a local
        folder named `s3:`: create(), which every rank calls, refuses it."""
        if not (isinstance(path, str) and URL.match(path)):
            super().makedirs(path, exist_ok=exist_ok)

    def create(self, info: CheckpointCommitInfo) -> None:
        """Every rank, before DeepSpeed's own collectives of this save (its tag check): a tag that
        failed on any rank is raised here on every rank alike (fastckpt.commit.agreed_errors)."""
        if isinstance(info.save_dir, str) and URL.match(info.save_dir):  # every rank alike: no barrier left waiting
            raise ConfigError(f"DeepSpeed's save_dir {info.save_dir!r} is a URL: DeepSpeed writes its tag folders and "
                              "`latest` with local file calls, so it saves only to a local or mounted path; to keep "
                              'its tags in a bucket too, give the "fastckpt" entry "bucket": "s3://..." (docs/s3.md)')
        self.committer.raise_agreed()
        if self.mirror is not None:
            self.mirror.raise_agreed()
        if self.committer.is_withdrawn(info.save_dir):  # saved again after its removal: removed first
            self.committer.wait_for(info.save_dir)
        self._files = []
        self._tag_dir, self._marked = tag_folder(info), False

    def save(self, state_dict: Any, path: str) -> None:
        path = os.path.abspath(path)
        if os.path.dirname(path) == self._tag_dir and not self._marked:  # the tag's first file: the tag
            mark_open(*os.path.split(self._tag_dir))  # is fastckpt's before any byte of it is written
            self._marked = True
        if isinstance(state_dict, dict) and isinstance(state_dict.get("global_steps"), int):
            self._global_steps = state_dict["global_steps"]  # what its model-states file records
        pending = self.saves.save(state_dict, path, step=self.saves.gate.steps_seen, also_owned=self.update_only)
        self._files.append((path, pending))

    def commit(self, info: CheckpointCommitInfo) -> bool:
        """Every rank: the files saved into the tag's folder are one set of the ordered commit (none on
        any rank, as save_16bit_model's: no tag, no record); a file saved elsewhere (the 16-bit model
        in save_dir) is a plain file, durable before this returns, its failure raised on every rank."""
        files, self._files = self._files, []
        tag_dir = tag_folder(info)
        in_tag = [(path, pending) for path, pending in files if os.path.dirname(path) == tag_dir]
        self.committer.submit_tag(info.save_dir, info.tag, in_tag, step=self._global_steps,
                                  save_latest=bool(getattr(info, "save_latest", True)))
        self._global_steps = -1
        self._tag_dir = None
        self._plain_files_durable([(path, pending) for path, pending in files if os.path.dirname(path) != tag_dir])
        self.named.forget_landed()
        return True

    def _plain_files_durable(self, files: list) -> None:
        """Each file saved outside a tag, waited for until durable at its path; then, on every rank
        in one collective, whether every rank's are: if not, every rank raises (or warns, as
        on_error says) — never the rank that wrote the file alone."""
        failed = None
        for path, pending in files:
            try:
                pending.release_all()
                pending.wait()
                pending.wait_placed()  # behind a memory tier: persisted at its path, not only in memory
                pending.raise_placed()
            except Exception as e:  # noqa: BLE001 - every rank hears of it below
                failed = failed or CheckpointWriteError(f"{path}, saved outside a checkpoint tag, failed: {e}")
        if self.committer.agreement.all_ok(failed is None):
            return
        self.named.checkpointer.report_failure(failed or CheckpointWriteError(
            "a file saved outside a checkpoint tag (save_16bit_model's) failed on another rank; see its error there"))

    def in_flight(self) -> int:
        """Files saved and not yet durable on this rank."""
        return len(self.named.in_flight())

    def wait(self) -> None:
        """Until every tag saved so far is committed on every rank (and in the entry's bucket);
        raises the first error."""
        self._committed()
        if self.mirror is not None:
            self.mirror.wait()

    def _committed(self) -> None:
        """Until every tag saved so far is committed in save_dir on every rank (its upload to the
        bucket may still be under way)."""
        self.named.wait()
        self.committer.wait()

    def reconfigure(self, concurrency: Optional[int] = None, writers: Optional[int] = None) -> None:
        """New concurrency / writers (the tuner's N*, p*): every tag in flight commits first."""
        self._committed()
        self.named.reconfigure(concurrency=concurrency, writers=writers)
        self.group_gate.retarget(self.named.checkpointer)

    # -- loading ---------------------------------------------------------
    def load(self, path: str, map_location: MAP_LOCATION = None) -> Any:
        if self.pool and callable(map_location):  # DeepSpeed's map_location callables keep storages on the CPU
            map_location = None
        with torch.serialization.safe_globals(deepspeed_safe_globals()):
            return self.named.load(path, map_location, self.verify, mmap=False)

    def size_of(self, path: str) -> Optional[int]:
        """Bytes of what was saved at path: the file, or the pool's current version of it."""
        return self.named.size(path)

    def tag_to_load(self, load_dir: str, tag: Optional[str] = None, latest_file: str = "latest") -> Choice:
        """The tag every rank loads from load_dir (load_tag.choose), once every save of this
        process into load_dir has landed — this engine's and any other engine's still open.
        The ranks agree on it (load_tag.agreed_choice)."""
        self._committed()
        open_engines.wait_for_saves_into(load_dir)
        return agreed_choice(self.committer.agreement, load_dir, tag, self.size_of, latest_file, self.mirror)

    # -- closing ---------------------------------------------------------
    def cleanup(self) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        open_engines.closed(self)
        if self.preempt is not None:
            self.preempt.uninstall()  # its previous handler back, unless the signal came
        self.saves.end_run()
        try:
            self.named.close()
        finally:
            try:
                self.committer.close()
            finally:
                if self.mirror is not None:
                    self.mirror.close()
