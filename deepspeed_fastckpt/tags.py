"""A DeepSpeed tag as one set of fastckpt's commit for a set of files across ranks
(fastckpt.commit.file_sets): DeepSpeed's conventions only, the commit is the core's.

What is DeepSpeed's here: a tag's files lie in `save_dir/tag/`, so its record lies there too,
as `COMMIT` (the core's record, written by the core's one writer); once it
is durable, `save_dir/fastckpt-latest` names the tag, and so does DeepSpeed's own `latest`
when the save asked for it (DeepSpeed writes it with a plain open() when the save is issued;
it is written again here, atomically and durably, once the tag is committed); a pool-backed file leaves a pointer where DeepSpeed
globs for it; a save_dir withdrawn by its owner (Lightning's ModelCheckpoint) while tags of it
are in flight is deleted once they land, and they are not committed. The layout and its
readers: deepspeed_fastckpt.tag_records.
"""
from __future__ import annotations

import os
from typing import Callable, Optional

from fastckpt.session import Deadline, FileSets, NamedCheckpoints, make_agreement

from .tag_records import name_in_deepspeeds_latest, newest_counter, write_latest


class TagCommitter(FileSets):
    """The tags one engine saves through `named`, committed as sets of files in the order they
    were saved, on every rank (FileSets: wait, wait_for, is_withdrawn, raise_agreed, close).

    report(error): what a failed tag does to the training thread (default: raise it).
    committed(info, folder): each tag once landed, on every rank, info None when it was not committed
    (its upload to the entry's bucket: fastckpt.store.s3.folder_mirror.FolderMirror.drain);
    newest_in_bucket(): the highest counter the bucket holds: a save_dir's tags are numbered above it.
    """

    def __init__(self, named: NamedCheckpoints, report: Optional[Callable[[BaseException], None]] = None,
                 committed: Optional[Callable] = None, newest_in_bucket: Optional[Callable[[], int]] = None):
        config = named.config  # the engine's one settings object: its deadline, its format
        slack_s = config.commit_timeout_s
        self.format = "safetensors" if named.pool else config.format
        counted = newest_counter if newest_in_bucket is None else \
            (lambda save_dir: max(newest_counter(save_dir), newest_in_bucket()))
        super().__init__(make_agreement(slack_s), Deadline(config.stall_timeout_s, named.progress), slack_s,
                         newest_counter=counted, after_record=self._name_latest,
                         on_durable=named.leave_pointer if named.pool else None, report=report, name="fastckpt-tag",
                         committed=committed)
        self._save_latest: dict[str, bool] = {}  # tag folder -> whether its save asked for `latest`

    def submit_tag(self, save_dir: str, tag: str, files: list, step: int, save_latest: bool = True) -> None:
        """files: [(path, Pending)] this rank wrote for the tag; step: DeepSpeed's global_steps as its
        model-states file records them (-1 when this rank saved none); save_latest: the save's own
        (DeepSpeed writes `latest` only when it is set)."""
        folder = os.path.join(save_dir, str(tag))
        if self.agreement.rank == 0:  # the rank that writes the record, and `latest` after it
            self._save_latest[os.path.abspath(folder)] = save_latest
        self.submit(folder, files, step, self.format, meta={"tag": str(tag)}, label=f"tag {tag!r} in {save_dir}")

    def _name_latest(self, info) -> None:
        """Rank 0, once the tag's record is durable: fastckpt-latest names it, then DeepSpeed's `latest`."""
        save_dir, tag = os.path.dirname(info.path), os.path.basename(info.path)
        write_latest(save_dir, tag)
        if self._save_latest.pop(os.path.abspath(info.path), True):
            name_in_deepspeeds_latest(save_dir, tag, info.counter)
