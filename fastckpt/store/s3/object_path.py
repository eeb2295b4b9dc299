"""A caller's s3:// path (Lightning's `.ckpt` in a bucket) as the tier behind a memory copy of a
named checkpoint (fastckpt.store.named_tiers), through the S3 store's client.

The copy: the path's old commit record (`NAME.fastckpt-commit`, fastckpt.store.url_files') is
deleted first, so that it never vouches for new bytes; the memory copy is then uploaded straight
to the path's object (one multipart upload, checked against its record on the mapping it is sent
from: fastckpt.store.tier_copy.upload_part) — an object store shows an object whole or not at all,
so there is nothing to rename — then its new record is PUT, naming the memory copy's commit time
and counter (which save the object is, as the index says it of a local file). The memory folder's
index (fastckpt.store.path_tier) notes that the copy began, before the old record goes, and that it
landed: in between, a load reads the memory copy. No request is made under the owner's lock (a save on the training thread takes it): a path
removed while its copy was on its way is found so afterwards, and its object and record are
deleted again.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from ...commit import record as commit
from ...commit_info import CommitInfo
from ..url_files import MARKER_SUFFIX, Remote, forget_listing, object_of
from ..path_tier import PathTier
from ..tier_copy import upload_part
from .client import UPLOAD_CONCURRENCY


class ObjectPath(PathTier):
    """The s3:// path as the tier behind one memory copy (see the module docstring)."""

    def __init__(self, target: str, index: str, place: Callable[[str, Callable[[], None]], bool], remote: Remote):
        super().__init__(target, index, place)
        self.bucket, self.key = object_of(target, remote)
        self.part_bytes = remote.part_bytes

    def new_dir(self, step: int, counter: int) -> str:
        self._note({"pending": counter})  # until it lands, a load reads the memory copy, not the object
        return self.target  # an object: nothing to make

    def put_copy(self, src: str, url: str, entry, direct_io: bool = True) -> None:
        self.bucket.delete([self.key + MARKER_SUFFIX])
        upload_part(self.bucket, self.key, src, entry, self.part_bytes, UPLOAD_CONCURRENCY)

    def commit_rank(self, url: str, info: CommitInfo) -> None:
        parent, name = self.target.rsplit("/", 1)
        record = dataclasses.replace(info, path=parent, files=(dataclasses.replace(info.files[0], name=name),))
        commit.write_with(record, lambda raw: self.bucket.put_bytes(self.key + MARKER_SUFFIX, raw))
        if not self._place(self.target, lambda: None):  # removed by its owner meanwhile: gone again
            self.bucket.delete([self.key + MARKER_SUFFIX])
            self.bucket.delete([self.key])
            forget_listing(self.target)
            return
        forget_listing(self.target)
        self._note({"landed": info.counter, "time": info.time})

    def abort(self, folder, part, rank: int, stuck: bool = False) -> None:
        self.bucket.abort_uploads_of(self.key)
