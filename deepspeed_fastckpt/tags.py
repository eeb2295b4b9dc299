"""Tag-level commit of a DeepSpeed checkpoint: a background thread per engine takes tags in
order, waits for this rank's files, agrees with the other ranks (fastckpt's background gloo
group over DeepSpeed's process group), and rank 0 then writes the tag's commit record and
`fastckpt-latest` (the on-disk format and its readers: fastckpt.store.tag_records).
A save_dir withdrawn while tags of it are in flight (its owner removed it: Lightning's
ModelCheckpoint dropping a checkpoint it no longer keeps) is deleted once they land, and
they are not committed.
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import threading
from typing import Callable, Optional

from fastckpt.commit.agreement import Agreement
from fastckpt.errors import CheckpointWriteError
from fastckpt.fsutil import write_atomic
from fastckpt.store.tag_records import LATEST, TAG_RECORD, next_seq


class TagCommitter:
    """One background thread committing tags in the order they were saved, on every rank."""

    def __init__(self, agreement: Agreement, on_durable: Optional[Callable[[str], None]] = None,
                 report: Optional[Callable[[BaseException], None]] = None):
        """on_durable(path): called for each of this rank's files once it is durable.
        report(error): what a failed tag does to the training thread (default: raise it)."""
        self._agree = agreement
        self._on_durable = on_durable
        self._report = report
        self._queue: "queue.Queue" = queue.Queue()
        self._errors: list[BaseException] = []
        self._in_flight = 0
        self._dirs: dict[str, int] = {}  # save_dir -> tags of it in flight
        self._withdrawn: set[str] = set()  # save_dirs to delete once their tags land
        self._cv = threading.Condition()
        self._seq: dict[str, int] = {}
        self._thread = threading.Thread(target=self._run, name="fastckpt-deepspeed-commit", daemon=True)
        self._thread.start()

    def submit(self, save_dir: str, tag: str, files: list) -> None:
        """files: [(path, Pending)] this rank wrote for the tag."""
        with self._cv:
            self._in_flight += 1
            key = os.path.abspath(save_dir)
            self._dirs[key] = self._dirs.get(key, 0) + 1
        self._queue.put((save_dir, tag, files))

    @property
    def agreement(self) -> Agreement:
        return self._agree

    def wait_for(self, save_dir: str) -> None:
        """Until no tag of save_dir is in flight here (committed or failed); raises nothing."""
        key = os.path.abspath(save_dir)
        with self._cv:
            self._cv.wait_for(lambda: self._dirs.get(key, 0) == 0)

    def withdraw(self, save_dir: str) -> bool:
        """save_dir is removed by its owner: False if no tag of it is in flight here (the
        caller deletes it now); otherwise its tags in flight are not committed, their failures
        are no error, and the committer deletes save_dir once the last of them lands."""
        key = os.path.abspath(save_dir)
        with self._cv:
            if not self._dirs.get(key):
                return False
            self._withdrawn.add(key)
            return True

    def is_withdrawn(self, save_dir: str) -> bool:
        with self._cv:
            return os.path.abspath(save_dir) in self._withdrawn

    def wait(self) -> None:
        """Until every submitted tag is committed (or failed); raises the first failure."""
        with self._cv:
            self._cv.wait_for(lambda: self._in_flight == 0)
        self.raise_errors()

    def raise_errors(self) -> None:
        """Each failed tag since the last call, through `report` (raises the first by default)."""
        with self._cv:
            errors, self._errors = self._errors, []
        for e in errors:
            if self._report is None:
                raise e
            self._report(e)

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._queue.put(None)
            self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self._commit(*item)
            except BaseException as e:  # noqa: BLE001 - handed to the training thread
                with self._cv:
                    self._errors.append(e)
            finally:
                self._land(os.path.abspath(item[0]))

    def _land(self, key: str) -> None:
        """One tag of save_dir `key` is done; the last of a withdrawn save_dir deletes it
        before anyone waiting for that save_dir is woken."""
        with self._cv:
            remove = self._dirs[key] == 1 and key in self._withdrawn
            if not remove:
                self._done(key)
        if remove:
            shutil.rmtree(key, ignore_errors=True)
            with self._cv:
                self._done(key)

    def _done(self, key: str) -> None:
        """Under the lock: one tag of `key` fewer in flight."""
        self._in_flight -= 1
        self._dirs[key] -= 1
        if not self._dirs[key]:
            del self._dirs[key]
            self._withdrawn.discard(key)
        self._cv.notify_all()

    def _commit(self, save_dir: str, tag: str, files: list) -> None:
        mine, error = [], None
        for path, pending in files:
            try:
                info = pending.wait()
                if self._on_durable is not None:
                    self._on_durable(path)
                mine.append({"name": os.path.relpath(path, os.path.join(save_dir, tag)),
                             "bytes": info.bytes, "crc32": f"{info.files[0].crc32:08x}"})
            except BaseException as e:  # noqa: BLE001
                error = error or e
        ok = self._agree.all_ok(error is None, background=True)
        everyone = self._agree.gather(mine, background=True)
        if self.is_withdrawn(save_dir):
            return
        if error is not None:
            raise CheckpointWriteError(f"checkpoint tag {tag!r} in {save_dir} failed on this rank "
                                       f"({error}); the previous committed tag is intact") from error
        if not ok:
            raise CheckpointWriteError(f"checkpoint tag {tag!r} in {save_dir} failed on another rank; "
                                       "the previous committed tag is intact")
        if self._agree.rank == 0:
            seq = self._seq.get(save_dir) or next_seq(save_dir)
            self._seq[save_dir] = seq + 1
            record = {"tag": tag, "seq": seq, "world_size": self._agree.world_size,
                      "files": [f for rank_files in everyone for f in rank_files]}
            write_atomic(os.path.join(save_dir, tag, TAG_RECORD), json.dumps(record, indent=1).encode())
            write_atomic(os.path.join(save_dir, LATEST), tag.encode())
