"""The connection to an object store: one bucket, set up the way every AWS tool sets itself up.

Endpoint, region and credentials come from the `endpoint` setting when given, else from what boto3
reads (AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_PROFILE, the
config and credentials files, an instance role). The data moves through obstore (Rust's
object_store: parallel multipart uploads and ranged GETs, the GIL released; chosen by measuring,
benchmarks/s3_clients.py); the control calls obstore does not offer — listing and aborting
unfinished multipart uploads — go through boto3. Every call is bounded: a few retries with backoff
inside `retry_s`, each request inside `request_s`. Errors come out as OSError naming the object
(FileNotFoundError for a missing one), one line.
"""
from __future__ import annotations

import concurrent.futures
import logging
import mmap
import os
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Optional

import numpy as np

from ...errors import ConfigError
from .place import S3Place

MIN_PART = 5 << 20  # S3: every part of a multipart upload but the last is at least 5 MiB
MAX_PARTS = 10000
UPLOAD_CONCURRENCY = 8  # parts in flight per upload (benchmarks/s3_clients.py: 8 the fastest)
GET_BYTES = 16 << 20  # one ranged GET of a load (or a download)


@dataclass(frozen=True)
class ListedObject:
    key: str
    size: int
    etag: Optional[str]


@dataclass(frozen=True)
class Upload:
    """A multipart upload begun and neither completed nor aborted."""

    key: str
    upload_id: str
    initiated: float  # seconds since the epoch


def part_bytes(size: int, want: int) -> int:
    """The part size of a multipart upload of size bytes: `want`, at least S3's minimum, and large
    enough that the object needs at most MAX_PARTS parts."""
    return max(want, MIN_PART, -(-size // MAX_PARTS))


def _one_line(e: BaseException) -> str:
    """What went wrong, short: the HTTP status and S3's error code, and the retries spent, where the
    client's message says them (obstore's run to many lines); else its first 200 characters."""
    text = " ".join(str(e).split()).split(" Debug source", 1)[0]
    status = re.search(r"status code: (\d{3}[^:<]*)", text)
    if status:
        code = re.search(r"<Code>([^<]+)</Code>", text)
        retries = re.search(r"after (\d+) retries", text)
        return (f"HTTP {status.group(1).strip()}" + (f" ({code.group(1)})" if code else "")
                + (f" after {retries.group(1)} retries" if retries else ""))
    return text if len(text) <= 200 else text[:197] + "..."


class Bucket:
    """One bucket of an S3 server, read and written by key."""

    def __init__(self, place: S3Place, endpoint: Optional[str] = None, request_s: float = 60.0,
                 retry_s: float = 60.0, retries: int = 3):
        try:
            import boto3
            import obstore  # noqa: F401 - present, or the one-line error below
            from botocore.config import Config
            from obstore.auth.boto3 import Boto3CredentialProvider
            from obstore.store import S3Store
        except ImportError as e:
            raise ConfigError(f"{place.url}: s3:// places need obstore and boto3 ({e.name} is missing): "
                              "pip install 'fastckpt[s3]'") from None
        self.place = place
        for name in ("botocore.credentials", "botocore.configprovider"):  # "found credentials in ...", at
            if logging.getLogger(name).level == logging.NOTSET:  # each setup: said once by the user's own
                logging.getLogger(name).setLevel(logging.WARNING)  # config, never by ours (Hydra logs INFO)
        session = boto3.Session()
        if session.get_credentials() is None:
            raise ConfigError(f"{place.url}: no AWS credentials found (set AWS_ACCESS_KEY_ID and "
                              "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or ~/.aws/credentials)")
        self.control = session.client(
            "s3", endpoint_url=endpoint or None,
            config=Config(retries={"max_attempts": retries + 1, "mode": "standard"}, connect_timeout=10,
                          read_timeout=request_s, s3={"addressing_style": "path"}))
        self.endpoint = self.control.meta.endpoint_url
        region = session.region_name or self.control.meta.region_name or "us-east-1"
        self.store = S3Store(
            place.bucket, endpoint=self.endpoint, region=region, virtual_hosted_style_request=False,
            credential_provider=Boto3CredentialProvider(session),
            client_options={"allow_http": self.endpoint.startswith("http://"), "timeout": timedelta(seconds=request_s),
                            "connect_timeout": timedelta(seconds=10)},
            retry_config={"max_retries": retries, "retry_timeout": timedelta(seconds=retry_s),
                          "backoff": {"init_backoff": timedelta(milliseconds=200),
                                      "max_backoff": timedelta(seconds=5), "base": 2}})

    def url(self, key: str) -> str:
        return self.place.url_of(key)

    def _failed(self, what: str, key: str, e: BaseException) -> OSError:
        from obstore.exceptions import NotFoundError
        if isinstance(e, (NotFoundError, FileNotFoundError)) or getattr(e, "response", {}).get("Error", {}).get("Code") in (
                "NoSuchKey", "404", "NoSuchUpload"):
            return FileNotFoundError(f"{self.url(key)} does not exist")
        return OSError(f"{what} {self.url(key)} failed: {_one_line(e)} ({self.endpoint})")

    # -- writing -----------------------------------------------------------
    def put_file(self, key: str, path: str, part: int, concurrency: int,
                 check: Optional[Callable[[int], None]] = None) -> Optional[str]:
        """A local file uploaded as key (multipart, `concurrency` parts in flight); its ETag. The
        file is mapped and its pages handed to the client as they are (no copy into buffers of
        its own: on a memory filesystem the upload reads the spool's pages themselves).
        check(address): called on the mapped bytes before a byte is sent (it raises to stop).
        A failed upload is aborted (no parts of it left to bill) before its OSError is raised."""
        import obstore
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            mapped = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) if size else None
        view = memoryview(mapped) if mapped is not None else memoryview(b"")
        try:
            if check is not None and size:  # its errors are its own, not the upload's
                array = np.frombuffer(view, dtype=np.uint8)
                try:
                    check(array.ctypes.data)
                finally:
                    del array
            try:
                result = obstore.put(self.store, key, view, chunk_size=part_bytes(size, part),
                                     max_concurrency=concurrency, use_multipart=size > MIN_PART)
            except Exception as e:  # noqa: BLE001 - obstore's and the OS's, one error out
                self.abort_uploads_of(key)  # its parts are billed otherwise
                raise self._failed("upload of", key, e) from e
        finally:
            try:
                view.release()
                if mapped is not None:
                    mapped.close()
            except BufferError:  # the client still holds a view: the mapping goes with it
                pass
        return result.get("e_tag")

    def put_bytes(self, key: str, data: bytes, create_once: bool = False) -> Optional[str]:
        """A small object written whole; create_once: only where none exists (a conditional PUT,
        If-None-Match: *): FileExistsError when one does."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError
        try:
            result = obstore.put(self.store, key, data, mode="create" if create_once else "overwrite",
                                 use_multipart=False)
        except (AlreadyExistsError, PreconditionError) as e:
            raise FileExistsError(f"{self.url(key)} exists already") from e
        except Exception as e:  # noqa: BLE001
            raise self._failed("writing", key, e) from e
        return result.get("e_tag")

    def delete(self, keys: list[str]) -> None:
        """Objects gone (already gone is fine)."""
        import obstore
        if not keys:
            return
        try:
            obstore.delete(self.store, keys)
        except Exception as e:  # noqa: BLE001
            raise self._failed("deleting", keys[0], e) from e

    # -- reading -----------------------------------------------------------
    def get_bytes(self, key: str, limit: int) -> bytes:
        """A small object's bytes (FileNotFoundError: none; OSError: larger than limit)."""
        import obstore
        try:
            got = obstore.get(self.store, key)
            if got.meta["size"] > limit:
                raise OSError(f"{self.url(key)} is {got.meta['size']} bytes, more than the {limit} expected")
            return bytes(got.bytes())
        except OSError:
            raise
        except Exception as e:  # noqa: BLE001
            raise self._failed("reading", key, e) from e

    def size_of(self, key: str) -> Optional[int]:
        import obstore
        try:
            return int(obstore.head(self.store, key)["size"])
        except Exception as e:  # noqa: BLE001
            err = self._failed("reading", key, e)
            if isinstance(err, FileNotFoundError):
                return None
            raise err from e

    def stamp(self, key: str) -> Optional[dict]:
        """What identifies the object now: its size, ETag and modification time (None: there is none)."""
        import obstore
        try:
            meta = obstore.head(self.store, key)
        except Exception as e:  # noqa: BLE001
            err = self._failed("reading", key, e)
            if isinstance(err, FileNotFoundError):
                return None
            raise err from e
        return {"size": int(meta["size"]), "etag": meta.get("e_tag") or "",
                "mtime_ns": int(meta["last_modified"].timestamp() * 1e9)}

    def get_into(self, key: str, fd: int, size: int, part: int, threads: int,
                 done: Callable[[int], None] = lambda n: None) -> None:
        """The object's `size` bytes written at their offsets into the open file fd, by parallel
        ranged GETs of `part` bytes (`threads` in flight); done(n) after each range."""
        import obstore

        def one(start: int) -> None:
            end = min(size, start + part)
            try:
                data = obstore.get_range(self.store, key, start=start, end=end)
            except Exception as e:  # noqa: BLE001
                raise self._failed("reading", key, e) from e
            view = memoryview(data)
            if len(view) != end - start:
                raise OSError(f"{self.url(key)}: a ranged read of [{start}, {end}) returned {len(view)} bytes")
            written = 0
            while written < len(view):
                written += os.pwrite(fd, view[written:], start + written)
            done(end - start)

        with concurrent.futures.ThreadPoolExecutor(max(1, threads), thread_name_prefix="fastckpt-s3-get") as pool:
            for f in [pool.submit(one, s) for s in range(0, size, part)]:
                f.result()

    def download(self, key: str, path: str, size: int, part: int, threads: int) -> None:
        """The object's size bytes as the file path (made here; removed again when the read fails)."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
            self.get_into(key, fd, size, part, threads)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)

    def listing(self, prefix: str) -> list[ListedObject]:
        """Every object whose key starts with prefix."""
        import obstore
        try:
            out = []
            for batch in obstore.list(self.store, prefix=prefix):
                out.extend(ListedObject(m["path"], int(m["size"]), m.get("e_tag")) for m in batch)
            return out
        except Exception as e:  # noqa: BLE001
            raise self._failed("listing", prefix, e) from e

    # -- unfinished multipart uploads (boto3) --------------------------------
    def uploads(self, prefix: str) -> list[Upload]:
        """Multipart uploads begun under prefix and not yet completed or aborted."""
        out, args = [], {"Bucket": self.place.bucket, "Prefix": prefix}
        try:
            while True:
                page = self.control.list_multipart_uploads(**args)
                out.extend(Upload(u["Key"], u["UploadId"], u["Initiated"].timestamp()) for u in page.get("Uploads", []))
                if not page.get("IsTruncated"):
                    return out
                args.update(KeyMarker=page["NextKeyMarker"], UploadIdMarker=page["NextUploadIdMarker"])
        except Exception as e:  # noqa: BLE001 - botocore's, one error out
            raise self._failed("listing the uploads under", prefix, e) from e

    def abort_uploads_of(self, key: str) -> None:
        """Every unfinished multipart upload of key aborted (a failed one's parts are billed
        otherwise); the server unreachable: left to the next writer's start or retention."""
        try:
            for upload in self.uploads(key):
                if upload.key == key:
                    self.abort_upload(upload)
        except OSError:
            pass

    def abort_upload(self, upload: Upload) -> None:
        """An unfinished upload aborted: its parts freed (already gone is fine)."""
        try:
            self.control.abort_multipart_upload(Bucket=self.place.bucket, Key=upload.key, UploadId=upload.upload_id)
        except Exception as e:  # noqa: BLE001
            err = self._failed("aborting the upload of", upload.key, e)
            if not isinstance(err, FileNotFoundError):
                raise err from e


_BUCKETS: dict[tuple, Bucket] = {}
_BUCKETS_LOCK = __import__("threading").Lock()


def bucket_for(place: S3Place, endpoint: Optional[str] = None, timeout_s: float = 120.0) -> Bucket:
    """The one Bucket of this process for place's bucket, endpoint and timeout (setting one up
    reads the AWS configuration: done once)."""
    key = (place.bucket, endpoint, timeout_s) + tuple(os.environ.get(name) for name in (
        "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_REGION"))
    with _BUCKETS_LOCK:
        found = _BUCKETS.get(key)
        if found is None:
            found = _BUCKETS[key] = Bucket(place, endpoint, request_s=timeout_s, retry_s=timeout_s)
        return found
