"""Object storage against a real S3 (MinIO): the conditional writes compare-and-append is built
on, including a retried create and a race of concurrent creators."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
from sinkkit import cli_env

from mvsink.bench.s3proxy import S3Proxy
from mvsink.io.config import S3Settings
from mvsink.io.s3 import (
    ConditionalWritesIgnored,
    IndefiniteWrite,
    PreconditionFailed,
    Written,
    conditional_put,
    get_bytes,
    probe_conditional_writes,
    put_bytes,
    s3_client,
)
from mvsink.io.service import module_process
from mvsink.stack.procs import free_ports

pytestmark = pytest.mark.integration


def _key(name: str) -> str:
    return f"tests/{uuid.uuid4().hex}/{name}"


def test_if_none_match_creates_once(s3_settings: S3Settings) -> None:
    client, bucket, key = s3_client(s3_settings), s3_settings.bucket, _key("state/0")
    created = conditional_put(client, bucket, key, b"first")
    assert isinstance(created, Written)
    lost = conditional_put(client, bucket, key, b"second")
    assert lost == PreconditionFailed(etag=created.etag)
    assert get_bytes(client, bucket, key) == b"first"


def test_retried_create_that_landed_is_settled_as_written(s3_settings: S3Settings) -> None:
    """An HTTP retry of a create that already landed answers 412; the content decides."""
    client, bucket, key = s3_client(s3_settings), s3_settings.bucket, _key("state/0")
    first = conditional_put(client, bucket, key, b"payload-with-nonce-1234")
    again = conditional_put(client, bucket, key, b"payload-with-nonce-1234")
    assert isinstance(first, Written) and again == Written(first.etag)


def test_if_match_succeeds_only_for_the_current_etag(s3_settings: S3Settings) -> None:
    client, bucket, key = s3_client(s3_settings), s3_settings.bucket, _key("obj")
    etag = put_bytes(client, bucket, key, b"v1", "application/octet-stream")
    stale = conditional_put(
        client, bucket, key, b"v2", if_match='"00000000000000000000000000000000"'
    )
    assert isinstance(stale, PreconditionFailed) and stale.etag is not None
    assert get_bytes(client, bucket, key) == b"v1"
    replaced = conditional_put(client, bucket, key, b"v2", if_match=f'"{etag.strip(chr(34))}"')
    assert isinstance(replaced, Written)
    assert get_bytes(client, bucket, key) == b"v2"
    old = conditional_put(client, bucket, key, b"v3", if_match=f'"{etag.strip(chr(34))}"')
    assert old == PreconditionFailed(etag=replaced.etag)  # the etag moved on


def test_if_match_on_a_missing_key_fails(s3_settings: S3Settings) -> None:
    client = s3_client(s3_settings)
    result = conditional_put(client, s3_settings.bucket, _key("absent"), b"x", if_match='"abc"')
    assert result == PreconditionFailed(etag=None)


def test_concurrent_creators_exactly_one_wins(s3_settings: S3Settings) -> None:
    key = _key("state/1")

    def attempt(writer: int) -> tuple[int, bool]:
        client = s3_client(s3_settings)  # independent clients, as separate processes would have
        result = conditional_put(client, s3_settings.bucket, key, f"writer {writer}".encode())
        return writer, isinstance(result, Written)

    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(attempt, range(16)))
    winners = [writer for writer, won in outcomes if won]
    assert len(winners) == 1
    stored = get_bytes(s3_client(s3_settings), s3_settings.bucket, key)
    assert stored == f"writer {winners[0]}".encode()


def test_unreachable_endpoint_is_an_indefinite_write(s3_settings: S3Settings) -> None:
    (port,) = free_ports(1)
    nowhere = S3Settings(
        f"127.0.0.1:{port}",
        s3_settings.bucket,
        s3_settings.region,
        s3_settings.access_key,
        s3_settings.secret_key,
        secure=False,
    )
    with pytest.raises(IndefiniteWrite, match="outcome unknown"):
        conditional_put(s3_client(nowhere), nowhere.bucket, _key("x"), b"x")


@pytest.fixture
def forgetful(s3_settings: S3Settings) -> Iterator[S3Settings]:
    """`s3_settings` through a proxy that drops the conditions of every request
    (`If-None-Match`, `If-Match`): an S3 API that ignores conditional writes, as some do."""
    with S3Proxy(s3_settings.endpoint, frozenset({"If-None-Match", "If-Match"})) as proxy:
        yield replace(s3_settings, endpoint=proxy.endpoint)


def test_the_probe_passes_on_minio_and_leaves_nothing(s3_settings: S3Settings) -> None:
    key, said = _key("probe"), []
    probe_conditional_writes(s3_settings, key, said.append)
    assert len(said) == 4 and "412 precondition failed" in said[1] and "412" in said[2]
    listed = s3_client(s3_settings).list_objects(s3_settings.bucket, key)
    assert [o.object_name for o in listed] == []


def test_a_store_that_ignores_conditions_is_refused_and_no_service_starts_on_it(
    s3_settings: S3Settings, forgetful: S3Settings, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Through the proxy plain S3 calls work and conditions do not: the probe says so, and a
    service that writes to the store exits 2 naming it, before it does anything."""
    client = s3_client(forgetful)
    key = _key("state/0")
    assert isinstance(conditional_put(client, forgetful.bucket, key, b"first"), Written)
    assert get_bytes(client, forgetful.bucket, key) == b"first"  # the proxy forwards
    with pytest.raises(ConditionalWritesIgnored, match="does not honour conditional writes"):
        probe_conditional_writes(forgetful, _key("probe"))
    env = {
        **cli_env(kafka_bootstrap, forgetful, tmp_path),
        "MVSINK_SINK_ID": f"forgetful-{uuid.uuid4().hex[:6]}",
    }
    command, env = module_process("services.append", env)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"object storage at {forgetful.endpoint} wrote" in done.stderr
    assert "does not honour conditional writes" in done.stderr
