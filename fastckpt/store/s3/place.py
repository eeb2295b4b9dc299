"""An object store place named by URL: `s3://bucket/prefix` parsed into its bucket and key prefix.

Owns what an `s3://` URL may be (a bucket name S3 accepts, a prefix without empty or dot segments)
and how keys under it are spelled; imports nothing of fastckpt but its errors.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ...errors import ConfigError

SCHEME = "s3://"
BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")  # S3's bucket naming rule


def is_s3(path) -> bool:
    return isinstance(path, str) and path.startswith(SCHEME)


@dataclass(frozen=True)
class S3Place:
    """s3://bucket/prefix: `prefix` is the key every object of the place starts with ("" or "a/b")."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str, what: str = "the root") -> "S3Place":
        """The place a URL names; a one-line ConfigError saying what is wrong otherwise."""
        if not is_s3(url):
            raise ConfigError(f"{what} {url!r} is not an s3:// URL")
        bucket, _, prefix = url[len(SCHEME):].partition("/")
        if not BUCKET.match(bucket) or ".." in bucket:
            raise ConfigError(f"{what} {url!r} does not name a bucket (s3://BUCKET/prefix; a bucket name is 3-63 "
                              "lowercase letters, digits, dots and hyphens)")
        segments = [s for s in prefix.split("/") if s != ""] if prefix.strip("/") else []
        if prefix.strip("/") and (any(s in (".", "..") for s in segments) or "//" in prefix.strip("/")):
            raise ConfigError(f"{what} {url!r} has an empty, '.' or '..' segment in its key prefix")
        return cls(bucket, "/".join(segments))

    @property
    def url(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}" if self.prefix else f"{SCHEME}{self.bucket}"

    def key(self, *names: str) -> str:
        """The key of names under the prefix ("prefix/a/b")."""
        return "/".join(([self.prefix] if self.prefix else []) + [n.strip("/") for n in names])

    def url_of(self, key: str) -> str:
        return f"{SCHEME}{self.bucket}/{key}"

    def key_of(self, url: str) -> str:
        """The key of a URL in this bucket (ValueError: another bucket)."""
        head = f"{SCHEME}{self.bucket}/"
        if not url.startswith(head):
            raise ValueError(f"{url!r} is not in bucket {self.bucket}")
        return url[len(head):]
