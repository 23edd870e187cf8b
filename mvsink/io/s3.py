"""Object storage access: a MinIO-SDK client for plain S3 calls, and the one conditional write.

`conditional_put` is the only place that writes with `If-None-Match: *` / `If-Match: <etag>`.
minio-py 7.2's `put_object` cannot send those headers (it turns unknown headers into
`x-amz-meta-*` user metadata), so the request is a presigned PUT (SigV4 from the SDK's public
`presigned_put_object`) sent by urllib3 with the precondition header added. The SDK signs only
`host` in a presigned URL, which S3 and MinIO accept alongside unsigned standard headers.

Retries: urllib3 is told never to retry, because a retried create whose first attempt landed
answers 412 and would look like a lost race. Instead the outcome is settled by content:

* 200 -> `Written(etag)`;
* 412 -> read the current object: if its bytes equal ours, an earlier attempt of ours (or an
  identical write) is what is there -> `Written`; otherwise `PreconditionFailed(current_etag)`;
* timeout / connection error -> `IndefiniteWrite`: the write may or may not land later. Callers
  embed a unique nonce in what they write and settle it by calling `conditional_put` again with
  the same bytes (idempotent by the rule above) or by re-reading state.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import urllib3
from minio import Minio
from minio.error import S3Error

from mvsink.core.errors import ConfigError, MvsinkError
from mvsink.core.settings import S3Settings

_TIMEOUT = urllib3.Timeout(connect=5.0, read=30.0)


def conditional_http() -> urllib3.PoolManager:
    """A connection pool for `conditional_put`: no retries of its own (a retried conditional
    write would meet its own first attempt), the default timeouts. Its owner (a `MinioBlob`, a
    tool) keeps it for the connections' reuse."""
    return urllib3.PoolManager(retries=False, timeout=_TIMEOUT, maxsize=16)


@dataclass(frozen=True)
class Written:
    """The object now holds exactly our bytes; `etag` is its entity tag (quoted)."""

    etag: str


@dataclass(frozen=True)
class PreconditionFailed:
    """The precondition did not hold and the object holds other bytes (`etag`; None if gone)."""

    etag: str | None


ConditionalResult = Written | PreconditionFailed


class IndefiniteWrite(MvsinkError):
    """A conditional write whose outcome is unknown (timeout or broken connection)."""


class S3RequestError(MvsinkError):
    """An S3 request failed with an unexpected `status` (5xx: the server is unwell, worth a
    retry; 4xx: auth, a missing bucket, which no retry fixes)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def s3_client(settings: S3Settings, http: urllib3.PoolManager | None = None) -> Minio:
    """A MinIO-SDK client for `settings` (region fixed, so presigning needs no round trip);
    `http` replaces the SDK's connection pool (its timeouts and retries)."""
    endpoint = settings.endpoint.removeprefix("http://").removeprefix("https://")
    return Minio(
        endpoint,
        access_key=settings.access_key.reveal(),
        secret_key=settings.secret_key.reveal(),
        secure=settings.secure,
        region=settings.region,
        http_client=http,
    )


def ensure_bucket(client: Minio, bucket: str) -> bool:
    """Create `bucket` if missing; whether it was created. Idempotent, race-safe."""
    if client.bucket_exists(bucket):
        return False
    try:
        client.make_bucket(bucket)
    except S3Error as error:
        if error.code in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}:
            return False
        raise
    return True


class ConditionalWritesIgnored(ConfigError):
    """The object store wrote where a condition (`If-None-Match: *`, `If-Match`) should have
    refused: without it the shard's compare-and-append is no longer linearizable."""


def probe_conditional_writes(
    settings: S3Settings, key: str, say: Callable[[str], None] | None = None
) -> None:
    """Check at `key` of `settings`' bucket (absent, deleted afterwards) that the store honours
    the conditions `conditional_put` relies on: a second create and a write with a stale etag
    are refused, a write with the current etag is not. `say` gets one line per write.

    Raises:
        ConditionalWritesIgnored: a write the condition should have refused was made.
        IndefiniteWrite, S3RequestError: the store did not answer, or answered an error.
    """
    client, http, bucket = s3_client(settings), conditional_http(), settings.bucket
    say = say or (lambda _: None)
    try:
        first = conditional_put(client, bucket, key, b"probe 1", http=http)
        say(f"  If-None-Match: *  (new key)          -> {_described(first)}")
        second = conditional_put(client, bucket, key, b"probe 2", http=http)
        say(f"  If-None-Match: *  (existing key)     -> {_described(second)}")
        if not isinstance(first, Written) or not isinstance(second, PreconditionFailed):
            raise ConditionalWritesIgnored(
                f"object storage at {settings.endpoint} wrote {bucket}/{key} twice with "
                "`If-None-Match: *`: it does not honour conditional writes, which the shard's "
                "compare-and-append needs (an S3 API with them: MinIO, AWS S3 since 2024-11)"
            )
        stale = conditional_put(client, bucket, key, b"probe 3", http=http, if_match='"0"')
        say(f"  If-Match: <stale etag>               -> {_described(stale)}")
        fresh = conditional_put(client, bucket, key, b"probe 4", http=http, if_match=first.etag)
        say(f"  If-Match: <current etag>             -> {_described(fresh)}")
        if not isinstance(stale, PreconditionFailed) or not isinstance(fresh, Written):
            raise ConditionalWritesIgnored(
                f"object storage at {settings.endpoint} does not honour `If-Match` on "
                f"{bucket}/{key}, which the shard's compare-and-append needs"
            )
    finally:
        with contextlib.suppress(Exception):  # best effort: a stray probe object holds nothing
            client.remove_object(bucket, key)


def _described(result: ConditionalResult) -> str:
    if isinstance(result, Written):
        return f"written (etag {result.etag})"
    return f"412 precondition failed (current etag {result.etag})"


def conditional_put(
    client: Minio,
    bucket: str,
    key: str,
    data: bytes,
    *,
    http: urllib3.PoolManager | None = None,
    if_match: str | None = None,
    timeout: float | None = None,
) -> ConditionalResult:
    """Write `data` to `bucket/key` only if the key is absent, or if `if_match` is given, only if
    its current etag equals `if_match`, through the pool `http` (`conditional_http`; None: a
    pool of this call's own). `timeout` is the read timeout (default 30 s).

    Never retried at the HTTP level; see the module docs for how each outcome is settled.

    Raises:
        IndefiniteWrite: the request may or may not have been applied.
        S3RequestError: any other failure (auth, missing bucket, server error).
    """
    url = client.presigned_put_object(bucket, key, expires=timedelta(minutes=15))
    headers = {"Content-Length": str(len(data))}
    if if_match is None:
        headers["If-None-Match"] = "*"
    else:
        headers["If-Match"] = if_match
    try:
        wait = _TIMEOUT if timeout is None else urllib3.Timeout(connect=5.0, read=timeout)
        pool = conditional_http() if http is None else http
        response = pool.request("PUT", url, body=data, headers=headers, timeout=wait)
    except (urllib3.exceptions.HTTPError, OSError) as error:
        raise IndefiniteWrite(f"PUT {bucket}/{key}: outcome unknown: {error!r}") from error
    if response.status == 200:
        return Written(etag=str(response.headers.get("ETag", "")))
    if response.status == 412:
        return _settle_precondition_failed(client, bucket, key, data)
    if response.status == 404 and if_match is not None:
        return PreconditionFailed(etag=None)  # nothing to match: the key does not exist
    raise S3RequestError(
        f"PUT {bucket}/{key} answered {response.status}: {response.data[:300]!r}", response.status
    )


def _settle_precondition_failed(
    client: Minio, bucket: str, key: str, data: bytes
) -> ConditionalResult:
    try:
        response = client.get_object(bucket, key)
    except S3Error as error:
        if error.code == "NoSuchKey":
            return PreconditionFailed(etag=None)
        raise
    try:
        current = response.read()
        etag = response.headers.get("ETag")
    finally:
        response.close()
        response.release_conn()
    if current == data:
        return Written(etag=str(etag))
    return PreconditionFailed(etag=etag)


def put_bytes(client: Minio, bucket: str, key: str, data: bytes, content_type: str) -> str:
    """Unconditional PUT (write-once keys such as staged parts); the new etag."""
    result = client.put_object(bucket, key, io.BytesIO(data), len(data), content_type=content_type)
    return str(result.etag)


def get_bytes(client: Minio, bucket: str, key: str, length: int = 0, last: int = 0) -> bytes:
    """The whole object; its first `length` bytes, or its last `last` bytes (all of it if it
    is shorter)."""
    headers: dict[str, str | list[str] | tuple[str]] | None = (
        {"Range": f"bytes=-{last}"} if last else None
    )
    response = client.get_object(bucket, key, length=length, request_headers=headers)
    try:
        return bytes(response.read())
    finally:
        response.close()
        response.release_conn()


def prefix_bytes(client: Minio, bucket: str, prefix: str) -> tuple[int, int]:
    """(objects, bytes) stored under `prefix` in `bucket`."""
    count = total = 0
    for obj in client.list_objects(bucket, prefix=prefix, recursive=True):
        count += 1
        total += obj.size or 0
    return count, total
