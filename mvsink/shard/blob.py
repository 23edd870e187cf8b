"""What the shard needs of object storage and of time (persist's `Blob` and `SYSTEM_TIME`).

`Shard` makes every storage call through a `Blob` and reads every clock through a `Clock`, so
the same code runs against MinIO/S3 (`MinioBlob`, `SYSTEM`) and against the deterministic
simulation in `tests/sim`, which freezes calls, loses replies and moves time at will.

The calls and the guarantees the shard relies on (S3's, since 2020; MinIO's):

* `get` / `stat`: read-after-write; `None` for a missing key;
* `create`: conditional create (`If-None-Match: *`), settled by content as `mvsink.io.s3`
  describes; may raise `IndefiniteWrite` (the create may land later, or not at all);
* `put`: unconditional write of a write-once key (a part);
* `list`: the keys under a prefix after `start_after`, ascending, with etags and modification
  times. A key that exists for the whole call is listed; one created or deleted during it may
  or may not be (a LIST is not a snapshot);
* `remove`: deletes, one key after the other in the order given.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import urllib3
from minio import Minio
from minio.deleteobjects import DeleteObject
from minio.error import S3Error

from mvsink.core.errors import MvsinkError
from mvsink.io.s3 import (
    ConditionalResult,
    conditional_http,
    conditional_put,
    get_bytes,
    put_bytes,
)

_MISSING = ("NoSuchKey", "NoSuchObject")


@dataclass(frozen=True)
class Listed:
    """One key a LIST returned: its etag (unquoted), modification time (unix seconds), size."""

    key: str
    etag: str
    modified: float
    size: int = 0


def unquoted(etag: str | None) -> str:
    """An etag without the quotes some responses carry."""
    return (etag or "").strip('"')


class Blob(Protocol):
    """Object storage under one bucket (module docs)."""

    def get(self, key: str, *, last: int = 0) -> tuple[bytes, str] | None: ...

    def stat(self, key: str) -> str | None: ...

    def create(self, key: str, data: bytes, timeout: float | None = None) -> ConditionalResult: ...

    def put(self, key: str, data: bytes, content_type: str) -> str: ...

    def list(
        self, prefix: str, *, start_after: str = "", recursive: bool = False
    ) -> list[Listed]: ...

    def remove(self, keys: Iterable[str]) -> None: ...


class Clock(Protocol):
    """Wall-clock and monotonic time, and sleeping."""

    def time(self) -> float: ...

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The process's clocks."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM = SystemClock()


class MinioBlob:
    """`Blob` on a MinIO-SDK client and bucket; its conditional creates go through its own pool
    (`http`, default a new `conditional_http()`)."""

    def __init__(self, client: Minio, bucket: str, http: urllib3.PoolManager | None = None) -> None:
        self.client = client
        self.bucket = bucket
        self.http = conditional_http() if http is None else http

    def get(self, key: str, *, last: int = 0) -> tuple[bytes, str] | None:
        try:
            if last:
                return get_bytes(self.client, self.bucket, key, last=last), ""
            response = self.client.get_object(self.bucket, key)
        except S3Error as error:
            if error.code in _MISSING:
                return None
            raise
        try:
            return bytes(response.read()), unquoted(response.headers.get("ETag"))
        finally:
            response.close()
            response.release_conn()

    def stat(self, key: str) -> str | None:
        try:
            return unquoted(self.client.stat_object(self.bucket, key).etag)
        except S3Error as error:
            if error.code in _MISSING:
                return None
            raise

    def create(self, key: str, data: bytes, timeout: float | None = None) -> ConditionalResult:
        return conditional_put(self.client, self.bucket, key, data, http=self.http, timeout=timeout)

    def put(self, key: str, data: bytes, content_type: str) -> str:
        return unquoted(put_bytes(self.client, self.bucket, key, data, content_type))

    def list(self, prefix: str, *, start_after: str = "", recursive: bool = False) -> list[Listed]:
        objects = self.client.list_objects(
            self.bucket, prefix=prefix, recursive=recursive, start_after=start_after or None
        )
        return [
            Listed(
                o.object_name,
                unquoted(o.etag),
                o.last_modified.timestamp() if o.last_modified else time.time(),
                o.size or 0,
            )
            for o in objects
            if o.object_name is not None
        ]

    def remove(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        for start in range(0, len(keys), 1000):  # S3 DeleteObjects takes up to 1,000
            batch = [DeleteObject(k) for k in keys[start : start + 1000]]
            errors = list(self.client.remove_objects(self.bucket, batch))
            if errors:
                raise MvsinkError(f"deleting from {self.bucket}: {errors[:3]}")
