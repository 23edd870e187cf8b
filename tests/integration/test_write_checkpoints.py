"""Write-task checkpoints in real MinIO: written as Arrow IPC; Parquet ones (the older format)
still load and are removed once an Arrow checkpoint replaces them."""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from minio.commonconfig import CopySource

from mvsink.core.frontier import Frontier
from mvsink.core.rows import parse_row_schema
from mvsink.core.updates import normalize_updates
from mvsink.io.config import S3Settings
from mvsink.io.s3 import ensure_bucket, s3_client
from services.write import checkpoint
from services.write.checkpoint import StateCache

pytestmark = pytest.mark.integration
ROWS = parse_row_schema("k string not null")


@pytest.fixture(autouse=True)
def _fresh_executor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test runs as a fresh executor: its own local directory (and a `StateCache` of its
    own: empty memory)."""
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "executor-1"))


@pytest.fixture
def store(s3_settings: S3Settings) -> checkpoint.Checkpoints:
    return checkpoint.Checkpoints.of(s3_settings)


def test_a_parquet_checkpoint_loads_and_is_replaced(
    s3_settings: S3Settings,
    store: checkpoint.Checkpoints,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = s3_client(s3_settings)
    ensure_bucket(client, s3_settings.bucket)
    sink, cache = f"ckpt-{uuid.uuid4().hex[:6]}", StateCache()
    rows = normalize_updates(pa.table({"k": ["a", "b"], "_time": [3, 3], "_diff": [1, -1]}), ROWS)
    meta = {
        "since": [3],
        "folded_offset": 7,
        "desired_frontier": [4],
        "persist_folded": [3],
        "writer_id": "w",
    }
    for version in (4, 5):  # the two versions a writer keeps, as Parquet
        buf = io.BytesIO()
        pq.write_table(rows.replace_schema_metadata({"mvsink.write": json.dumps(meta)}), buf)
        client.put_object(
            s3_settings.bucket,
            checkpoint.checkpoint_key(sink, 0, version, "parquet"),
            io.BytesIO(buf.getvalue()),
            len(buf.getvalue()),
        )
    state, size = store.load(sink, 0, 5, ROWS, 0, cache)
    assert size == len(buf.getvalue())
    assert state.legacy and state.folded_offset == 7 and state.desired_frontier == Frontier.at(4)
    assert sorted(state.correction.consolidate().column("k").to_pylist()) == ["a", "b"]
    assert store.save(sink, 0, "w", state, cache)  # writes version 6 as Arrow
    store.settle()  # the superseded versions are deleted off the step's path
    names = sorted(
        o.object_name.rsplit("/", 1)[-1]
        for o in client.list_objects(s3_settings.bucket, prefix=f"sinks/{sink}/write/p0/")
    )
    assert names == [f"{6:020d}.arrow"]
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "executor-2"))
    cache = StateCache()  # a new executor: loads version 6 from object storage
    again, size = store.load(sink, 0, 6, ROWS, 0, cache)
    assert size > 0
    assert (
        not again.legacy
        and again.folded_offset == 7
        and again.correction.consolidate().num_rows == 2
    )


def test_another_python_worker_of_the_executor_continues_from_its_warm_copy(
    s3_settings: S3Settings,
    store: checkpoint.Checkpoints,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spark runs a task in any of an executor's Python workers: one that never held the
    partition continues from the executor's warm copy (staged parts included) without reading
    object storage; another executor reads the checkpoint; a lost race drops the warm copy."""
    ensure_bucket(s3_client(s3_settings), s3_settings.bucket)
    sink, cache = f"warm-{uuid.uuid4().hex[:6]}", StateCache()
    state, size = store.load(sink, 3, -1, ROWS, 0, cache)
    assert size == 0 and state.version == -1
    rows = normalize_updates(pa.table({"k": ["a"], "_time": [1], "_diff": [1]}), ROWS)
    state.correction.insert(rows)
    state.staged["part-key"] = (Frontier.at(2), rows)
    assert store.save(sink, 3, "w", state, cache)
    cache = StateCache()  # the same executor, another Python worker
    warm, size = store.load(sink, 3, 0, ROWS, 0, cache)
    assert size == 0 and warm.version == 0 and warm is not state
    assert warm.staged["part-key"][1].equals(rows) and len(warm.correction) == 1
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "executor-2"))
    cache = StateCache()
    cold, size = store.load(sink, 3, 0, ROWS, 0, cache)
    assert size > 0 and cold.version == 0 and cold.staged == {}
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "executor-1"))
    stale = checkpoint.PartitionState(
        -1, warm.correction, 0, Frontier.minimum(), Frontier.minimum()
    )
    assert store.save(sink, 3, "other", stale, cache) is None  # version 0 exists
    cache = StateCache()
    _, size = store.load(sink, 3, 0, ROWS, 0, cache)
    assert size > 0  # the warm copy went with the lost race


def _names(client: object, s3: S3Settings, sink: str) -> list[str]:
    return sorted(
        o.object_name.rsplit("/", 1)[-1]
        for o in client.list_objects(s3.bucket, prefix=f"sinks/{sink}/write/p0/")  # type: ignore[attr-defined]
    )


def test_saves_keep_two_versions_and_a_new_owner_collects_what_a_dead_one_left(
    s3_settings: S3Settings,
    store: checkpoint.Checkpoints,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each save queues the version two behind it for deletion, off the step's path; what a
    process leaves undeleted (it died with deletes queued, or a late create landed after its
    key was collected) the partition's next owner deletes when it gains the partition, keeping
    the two newest, while the chain goes on from the newest."""
    client = s3_client(s3_settings)
    ensure_bucket(client, s3_settings.bucket)
    sink, cache = f"gc-{uuid.uuid4().hex[:6]}", StateCache()
    state, _ = store.load(sink, 0, -1, ROWS, 0, cache)
    for version in range(4):
        state.folded_offset = version
        assert store.save(sink, 0, "w", state, cache)
        assert state.version == version
    store.settle()
    assert _names(client, s3_settings, sink) == [f"{2:020d}.arrow", f"{3:020d}.arrow"]
    # What a dead process's queued deletes leave: older versions, and a late legacy one.
    key = checkpoint.checkpoint_key(sink, 0, 3)
    for old in (0, 1):
        client.copy_object(
            s3_settings.bucket,
            checkpoint.checkpoint_key(sink, 0, old),
            CopySource(s3_settings.bucket, key),
        )
    client.copy_object(
        s3_settings.bucket,
        checkpoint.checkpoint_key(sink, 0, 1, "parquet"),
        CopySource(s3_settings.bucket, key),
    )
    assert len(_names(client, s3_settings, sink)) == 5
    assert store.collect_superseded(sink, 0) == 3
    assert _names(client, s3_settings, sink) == [f"{2:020d}.arrow", f"{3:020d}.arrow"]
    assert store.collect_superseded(sink, 0) == 3  # nothing more to delete
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "executor-2"))  # the new owner's
    fresh, size = store.load(sink, 0, 3, ROWS, 0, StateCache())
    assert size > 0 and fresh.folded_offset == 3
    assert store.collect_superseded(f"{sink}-none", 0) == -1
