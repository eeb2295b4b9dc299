"""Tag-level commit of a DeepSpeed checkpoint, and finding the newest committed tag.

A DeepSpeed tag (`save_dir/tag/`) is several files per rank (model states, ZeRO optimizer
partitions). Each file is made durable and renamed into place on its own; the tag is
committed only when every rank's files are durable: a background thread per engine takes
tags in order, waits for this rank's files, agrees with the other ranks (fastckpt's
background gloo group over DeepSpeed's process group), and rank 0 then writes
`save_dir/tag/fastckpt-tag.json` (every file with its size and CRC-32, and a sequence
number) and `save_dir/fastckpt-latest`, both atomically. DeepSpeed's own `latest` file is
written with a plain open() and may be missing, torn, or name a tag that never completed;
`newest_committed` ignores it.

Before any file of a tag is written, `mark_open` leaves `save_dir/tag/fastckpt-tag.open`: a
tag with that mark and no record is one fastckpt began and never committed. Files fastckpt
wrote can also arrive in a tag it never saved (ds_to_universal copies the model-state files
into its universal tag); without the mark they are another writer's checkpoint. The mark's
directory entry is made durable by the directory sync that follows the first file's rename.
"""
from __future__ import annotations

import json
import os
import queue
import threading
from typing import Callable, Optional

from fastckpt.distributed import Agreement
from fastckpt.errors import CheckpointWriteError, CorruptCheckpointError
from fastckpt.fsutil import write_atomic

TAG_RECORD = "fastckpt-tag.json"
TAG_OPEN = "fastckpt-tag.open"
LATEST = "fastckpt-latest"


def _parse_record(save_dir: str, tag: str) -> dict:
    path = os.path.join(save_dir, tag, TAG_RECORD)
    try:
        with open(path, "rb") as f:
            rec = json.loads(f.read())
        return {"tag": tag, "seq": int(rec["seq"]), "files": list(rec["files"])}
    except FileNotFoundError:
        raise CorruptCheckpointError(f"tag {tag!r} in {save_dir} was never committed "
                                     f"(no {TAG_RECORD}): its files may be incomplete") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CorruptCheckpointError(f"{path}: damaged commit record ({e})") from None


def mark_open(save_dir: str, tag: str) -> None:
    """Marks `save_dir/tag` as a tag fastckpt is saving (every rank may; it stays after the commit)."""
    tag_dir = os.path.join(save_dir, str(tag))
    os.makedirs(tag_dir, exist_ok=True)
    os.close(os.open(os.path.join(tag_dir, TAG_OPEN), os.O_WRONLY | os.O_CREAT, 0o644))


def file_size(path: str) -> Optional[int]:
    return os.path.getsize(path) if os.path.isfile(path) else None


def read_record(save_dir: str, tag: str, size_of: Callable[[str], Optional[int]] = file_size) -> dict:
    """The commit record of a tag, checked against the files it names (size_of: a file's size,
    or of the pool version saved under that path); CorruptCheckpointError if not."""
    rec = _parse_record(save_dir, tag)
    for f in rec["files"]:
        size = size_of(os.path.join(save_dir, tag, f["name"]))
        if size != f["bytes"]:
            raise CorruptCheckpointError(f"tag {tag!r}: {f['name']} is {size} bytes, its commit record "
                                         f"says {f['bytes']}")
    return rec


def newest_committed(save_dir: str, size_of: Callable[[str], Optional[int]] = file_size) -> Optional[str]:
    """The committed tag with the highest sequence number (None if there is none)."""
    best: Optional[dict] = None
    if not os.path.isdir(save_dir):
        return None
    for tag in os.listdir(save_dir):
        if not os.path.isfile(os.path.join(save_dir, tag, TAG_RECORD)):
            continue
        try:
            rec = read_record(save_dir, tag, size_of)
        except CorruptCheckpointError:
            continue
        if best is None or rec["seq"] > best["seq"]:
            best = rec
    return None if best is None else best["tag"]


def next_seq(save_dir: str) -> int:
    seqs = [0]
    for tag in os.listdir(save_dir) if os.path.isdir(save_dir) else []:
        try:
            seqs.append(_parse_record(save_dir, tag)["seq"])
        except CorruptCheckpointError:
            pass
    return max(seqs) + 1


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
                with self._cv:
                    self._in_flight -= 1
                    key = os.path.abspath(item[0])
                    self._dirs[key] -= 1
                    if not self._dirs[key]:
                        del self._dirs[key]
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
