"""A caller's s3:// path (Lightning's `.ckpt` in a bucket) as the tier behind a memory copy of a
named checkpoint (fastckpt.store.named_tiers), through the S3 store's client.

The copy: the path's old commit record (`NAME.fastckpt-commit`, fastckpt.store.path_store's) is
deleted first, so that it never vouches for new bytes; the memory copy is then uploaded straight
to the path's object (one multipart upload, checked against its record on the mapping it is sent
from: fastckpt.store.tier_copy.upload_part) — an object store shows an object whole or not at all,
so there is nothing to rename — then its new record is PUT, and the memory folder's index
(fastckpt.store.path_tier) notes the object the path now holds: its ETag, size and modification
time. A path removed while its copy was uploading gets the object deleted again, never a record.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from ...commit import record as commit
from ...commit_info import CommitInfo
from ..path_store import MARKER_SUFFIX
from ..path_tier import PathTier
from ..tier_copy import upload_part
from .client import MIN_PART, UPLOAD_CONCURRENCY, bucket_for
from .place import S3Place



def object_of(url: str, endpoint: Optional[str], timeout_s: float):
    """(the Bucket client, the key) of an s3:// path (a one-line ConfigError for a bad one)."""
    place = S3Place.parse(url, "the checkpoint path")
    return bucket_for(place, endpoint, timeout_s), place.prefix


class ObjectPath(PathTier):
    """The s3:// path as the tier behind one memory copy (see the module docstring)."""

    def __init__(self, target: str, index: str, place: Callable[[str, Callable[[], None]], bool],
                 endpoint: Optional[str] = None, part_mb: int = 64, timeout_s: float = 120.0):
        super().__init__(target, index, place)
        self.bucket, self.key = object_of(target, endpoint, timeout_s)
        self.part_bytes = max(MIN_PART, part_mb << 20)

    def new_dir(self, step: int, counter: int) -> str:
        return self.target  # an object: nothing to make

    def put_copy(self, src: str, url: str, entry, direct_io: bool = True) -> None:
        self.bucket.delete([self.key + MARKER_SUFFIX])
        upload_part(self.bucket, self.key, src, entry, self.part_bytes, UPLOAD_CONCURRENCY)

    def commit_rank(self, url: str, info: CommitInfo) -> None:
        parent, name = self.target.rsplit("/", 1)
        record = dataclasses.replace(info, path=parent, files=(dataclasses.replace(info.files[0], name=name),))
        if not self._place(self.target, lambda: commit.write_with(
                record, lambda raw: self.bucket.put_bytes(self.key + MARKER_SUFFIX, raw))):
            self.bucket.delete([self.key])  # removed by its owner while it was uploading
            return
        made = self.bucket.stamp(self.key)
        if made is not None:
            self._note(dict(made, time=info.time, counter=info.counter))

    def abort(self, folder, part, rank: int, stuck: bool = False) -> None:
        self.bucket.abort_uploads_of(self.key)
