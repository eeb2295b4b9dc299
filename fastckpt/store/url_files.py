"""A checkpoint file at a URL (the path store's, and the tiers' in front of it): uploaded from a
local file, its commit record `NAME.fastckpt-commit` (fastckpt.commit.record's: the file's size,
whole-file CRC and chunk CRCs) written last, read back and checked against it, removed.

`s3://` goes through the S3 store's client (fastckpt.store.s3.client: one multipart upload, parallel
ranged GETs; `Remote` says how the server is reached: the settings' endpoint, request time and part
size); `gcs://`, `memory://`, ... through fsspec. Object stores have no atomic rename: the old record
is deleted before new bytes go up, and a reader checks NAME against its record when there is one; a
URL without one (a file fastckpt did not upload) is read as Lightning would read it, checked by its
own CRCs. fsspec's listing cache of a folder is dropped after each write (Lightning lists the folder
through fsspec: its next listing sees what was put or deleted).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from typing import Optional

from ..commit import record as commit
from ..commit_info import CommitInfo, FileEntry
from ..errors import CheckpointWriteError, CorruptCheckpointError
from ..format import load_file, sniff
from ..machine import read_threads
from .s3.client import GET_BYTES, MIN_PART, UPLOAD_CONCURRENCY, bucket_for
from .s3.place import S3Place, is_s3

MARKER_SUFFIX = ".fastckpt-commit"


@dataclass(frozen=True)
class Remote:
    """How s3:// paths are reached: the settings' `endpoint` (None: as AWS tools find the server),
    the time one request may take, and the size of one part of an upload (the settings' chunk_mb)."""

    endpoint: Optional[str] = None
    timeout_s: float = 120.0
    part_bytes: int = 64 << 20

    @classmethod
    def of(cls, config) -> "Remote":
        """As a CheckpointerConfig says."""
        return cls(config.endpoint, config.stall_timeout_s, max(MIN_PART, config.chunk_mb << 20))


AS_AWS_TOOLS = Remote()


def filesystem(url: str):
    """The fsspec filesystem of url, its listing cache of url's folder dropped: fsspec shares one
    instance per process (Lightning's own listings fill it), and a stale entry would say an object
    just uploaded, or its record, is not there."""
    import fsspec
    fs, _ = fsspec.core.url_to_fs(url)
    fs.invalidate_cache(url.rstrip("/").rsplit("/", 1)[0])
    return fs


def object_of(url: str, remote: Remote = AS_AWS_TOOLS):
    """(the S3 store's client, the key) of an s3:// URL; None for other schemes, which fsspec serves."""
    if not is_s3(url):
        return None
    place = S3Place.parse(url, "the checkpoint path")
    return bucket_for(place, remote.endpoint, remote.timeout_s), place.prefix


def forget_listing(url: str) -> None:
    """fsspec's listing cache of url's folder dropped, where fsspec serves the scheme at all."""
    try:
        filesystem(url)
    except ImportError:  # no fsspec filesystem for it here (s3fs missing): nothing cached either
        pass


def prepare(url: str) -> None:
    """The URL's folder made, where its scheme has folders (a bucket has none)."""
    if not is_s3(url):
        filesystem(url).makedirs(url.rsplit("/", 1)[0], exist_ok=True)


def upload(local: str, url: str, result, remote: Remote = AS_AWS_TOOLS) -> None:
    """local's bytes (a file the write path just made durable: result) put at url, the old record
    deleted first (it must never vouch for the new bytes mid-upload), the new record last; local
    removed in any case."""
    found = object_of(url, remote)
    fs = None if found is not None else filesystem(url)
    try:
        if found is not None:
            bucket, key = found
            bucket.delete([key + MARKER_SUFFIX])
            try:
                bucket.put_file(key, local, remote.part_bytes, UPLOAD_CONCURRENCY)
            except OSError as e:  # aborted by the client
                raise CheckpointWriteError(str(e)) from e
        else:
            try:
                fs.rm(url + MARKER_SUFFIX)
            except FileNotFoundError:
                pass
            fs.put_file(local, url)
        parent, name = url.rsplit("/", 1)
        entry = FileEntry(name, 0, result.bytes, result.file_crc, [list(s) for s in result.spans], result.names or [])
        info = CommitInfo(step=-1, path=parent, bytes=result.bytes, counter=1, time=time.time(), world_size=1,
                          format=sniff(local), files=(entry,))
        if found is not None:
            commit.write_with(info, lambda raw: found[0].put_bytes(found[1] + MARKER_SUFFIX, raw))
            forget_listing(url)
        else:
            commit.write(info, name + MARKER_SUFFIX, fs=fs)
    finally:
        try:
            os.unlink(local)
        except FileNotFoundError:
            pass


def record_bytes(url: str, remote: Remote = AS_AWS_TOOLS) -> Optional[bytes]:
    """The raw commit record of the file at url (one read); None when it has none."""
    found = object_of(url, remote)
    try:
        if found is not None:
            return found[0].get_bytes(found[1] + MARKER_SUFFIX, commit.MAX_RECORD + 1)
        with filesystem(url).open(url + MARKER_SUFFIX, "rb") as f:
            return f.read(commit.MAX_RECORD + 1)
    except FileNotFoundError:
        return None


def read_marker(url: str, remote: Remote = AS_AWS_TOOLS, required: bool = True) -> Optional[dict]:
    """The commit record of an uploaded checkpoint: {"size", "crc32"}; CorruptCheckpointError if
    bad, or missing where required (else None). A record fastckpt 0.1 wrote (plain JSON: size, hex
    crc32) still reads."""
    path = url + MARKER_SUFFIX
    raw = record_bytes(url, remote)
    if raw is None:
        if not required:
            return None
        raise CorruptCheckpointError(f"{url} has no commit record ({path}): its upload never finished")
    try:
        body = json.loads(raw)
        if isinstance(body, dict) and "body" not in body:  # 0.1
            return {"size": int(body["size"]), "crc32": int(body["crc32"], 16)}
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise CorruptCheckpointError(f"the commit record of {url} is unreadable: {e}") from e
    info = commit.decode(raw, path)
    if len(info.files) != 1 or info.files[0].name != url.rsplit("/", 1)[1]:
        raise CorruptCheckpointError(f"the commit record of {url} names other files: {[f.name for f in info.files]}")
    return {"size": info.files[0].bytes, "crc32": info.files[0].crc32}


def size_at(url: str, remote: Remote = AS_AWS_TOOLS) -> Optional[int]:
    """What the record of the file at url says its size is (the object's own size when another
    writer put it there without one); None when there is no file."""
    rec = read_marker(url, remote, required=False)
    if rec is not None:
        return rec["size"]
    found = object_of(url, remote)
    if found is not None:
        return found[0].size_of(found[1])
    fs = filesystem(url)
    return fs.size(url) if fs.exists(url) else None


def download(url: str, into_dir: str, remote: Remote = AS_AWS_TOOLS) -> tuple[str, int | None]:
    """Copies a checkpoint at a URL to a local file; returns (path, the whole-file CRC its
    commit record expects). A URL without a commit record (a file fastckpt did not upload)
    comes back with None: its loader checks it by the file's own CRCs only."""
    local = os.path.join(into_dir, "download.tmp")
    rec = read_marker(url, remote, required=False)
    found = object_of(url, remote)
    if found is not None:  # parallel ranged GETs
        bucket, key = found
        size = bucket.size_of(key)
        if size is None:
            raise FileNotFoundError(f"checkpoint {url!r} does not exist")
        bucket.download(key, local, size, GET_BYTES, read_threads())
    else:
        try:
            filesystem(url).get_file(url, local)
        except FileNotFoundError:
            raise FileNotFoundError(f"checkpoint {url!r} does not exist") from None
    size = os.path.getsize(local)
    if rec is not None and size != rec["size"]:
        raise CorruptCheckpointError(f"{url} is {size} bytes but its commit record says {rec['size']}")
    return local, rec["crc32"] if rec is not None else None


def load_url(url: str, map_location, verify: bool, weights_only: bool, remote: Remote = AS_AWS_TOOLS):
    """The checkpoint at url, downloaded and loaded (checked against its record when it has one)."""
    tmp = tempfile.mkdtemp(prefix="fastckpt-download-")
    try:
        local, crc = download(url, tmp, remote)
        if crc is None:
            warnings.warn(f"fastckpt: {url} has no fastckpt commit record ({url}{MARKER_SUFFIX}): "
                          "it was not uploaded by fastckpt (or its upload was cut short after the data); "
                          "loaded as Lightning would, checked only by its own CRCs", stacklevel=6)
        return load_file(local, map_location, verify, weights_only, expect_crc=crc, mmap=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remove_url(url: str, remote: Remote = AS_AWS_TOOLS) -> None:
    """The file at url and its record deleted, the record first (never a record without its file)."""
    found = object_of(url, remote)
    if found is not None:
        found[0].delete([found[1] + MARKER_SUFFIX])
        found[0].delete([found[1]])
        forget_listing(url)
        return
    fs = filesystem(url)
    for name in (url + MARKER_SUFFIX, url):
        try:
            fs.rm(name, recursive=True)
        except FileNotFoundError:
            pass
