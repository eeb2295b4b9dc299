"""A checkpoint's record in an object store, read and checked against what is listed there: the
one check of the S3 store's checkpoints (s3_store.py), of DCP's on S3 (fastckpt.dcp.on_s3) and of
the mirrored folders (folder_mirror.py), and the one scan of the checkpoints committed under a
prefix; and a checkpoint's removal, its record first.

The record is trusted only when every object it names is listed under the checkpoint's prefix, of
the size it says and with the ETag it says (an object written over after the commit has another);
full CRCs are the loader's.
"""
from __future__ import annotations

from typing import Callable, Iterable, Optional

from ...commit import record as commit
from ...commit_info import CommitInfo
from ...errors import CorruptCheckpointError
from .client import Bucket, ListedObject
from .place import S3Place


def read_checked(bucket: Bucket, folder: S3Place, objects: dict[str, ListedObject], every_rank: bool) -> CommitInfo:
    """The record of the checkpoint at folder (its prefix), checked against objects (key -> ListedObject,
    at least those under folder); CorruptCheckpointError says what does not match, OSError what
    could not be read."""
    key = folder.key(commit.COMMIT_NAME)

    def size_of(url: str):
        listed = objects.get(folder.key_of(url))
        return listed.size if listed is not None else None
    info = commit.parse(bucket.get_bytes(key, commit.MAX_RECORD), folder.url_of(key), size_of, every_rank=every_rank)
    for f in info.files:
        listed = objects.get(folder.key(f.name))
        if f.etag and listed is not None and listed.etag and listed.etag != f.etag:
            raise CorruptCheckpointError(f"{folder.url}: object {f.name} is not the one its commit record names "
                                         f"(ETag {listed.etag}, the record says {f.etag}): it was written over")
    return info


def recorded(parent: S3Place, keys: Iterable[str]) -> list[str]:
    """The names of the folders directly under parent that have a record among the listed keys."""
    base = parent.key("")
    return [k[len(base):].split("/", 1)[0] for k in keys
            if k.startswith(base) and k[len(base):].count("/") == 1 and k.endswith("/" + commit.COMMIT_NAME)]


def committed_under(bucket: Bucket, parent: S3Place, objects: Optional[dict[str, ListedObject]] = None,
                    every_rank: bool = False, named: Callable[[str], bool] = lambda name: True,
                    passed: tuple[type[BaseException], ...] = (CorruptCheckpointError, OSError),
                    problems: Optional[list] = None) -> list[CommitInfo]:
    """The checkpoints committed in the folders directly under parent (those whose name `named`
    takes), each record checked (read_checked), newest commit first. objects: the listing under
    parent (None: listed now). A folder whose reading raises one of `passed` is passed over, and
    said in problems."""
    objects = {o.key: o for o in bucket.listing(parent.key(""))} if objects is None else objects
    found = []
    for name in filter(named, recorded(parent, objects)):
        try:
            found.append(read_checked(bucket, S3Place(parent.bucket, parent.key(name)), objects, every_rank))
        except passed as e:
            if problems is not None:
                problems.append(str(e))
    return sorted(found, key=lambda info: info.counter, reverse=True)


def remove_folder(bucket: Bucket, folder: S3Place) -> None:
    """A checkpoint's objects deleted, its record first (a crash part-way leaves objects no reader
    takes for a checkpoint, never a record naming objects that are gone)."""
    record_key = folder.key(commit.COMMIT_NAME)
    bucket.delete([record_key])
    bucket.delete([o.key for o in bucket.listing(folder.key("")) if o.key != record_key])
