"""`services.ct.sink.truncating_compare_and_append` on a real shard (MinIO): the continual
task's write, racing another replica writing the same output."""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa
import pytest

from mvsink.core.frontier import Frontier
from mvsink.io.config import S3Settings
from mvsink.shard import Shard, open_shard
from services.ct.sink import truncating_compare_and_append

pytestmark = pytest.mark.integration
ROWS = pa.schema([("customer", pa.string()), ("orders", pa.int64())])
F = Frontier.at


def _updates(*rows: tuple[str, int, int, int]) -> pa.Table:
    columns = list(zip(*rows, strict=True)) if rows else [(), (), (), ()]
    return pa.table(
        {
            "customer": pa.array(columns[0], pa.string()),
            "orders": pa.array(columns[1], pa.int64()),
            "_time": pa.array(columns[2], pa.int64()),
            "_diff": pa.array(columns[3], pa.int64()),
        }
    )


def _contents(shard: Shard, as_of: int) -> dict[tuple[Any, ...], int]:
    rows = shard.snapshot(F(as_of + 1)).to_pylist()  # times <= as_of
    return {(r["customer"], r["orders"]): r["_diff"] for r in rows}


@pytest.fixture
def output(s3_settings: S3Settings) -> Shard:
    return open_shard(f"ct-{uuid.uuid4().hex[:12]}", ROWS, s3_settings)


def test_writes_from_the_upper_and_reports_the_new_one(output: Shard) -> None:
    """Invariants 2 and 3 (`services.ct`): an empty write moves the upper, a write at 3 moves
    it to 4."""
    assert truncating_compare_and_append(output, _updates(), F(3), "r1") == (F(3), True)  # no data
    written = _updates(("a", 1, 3, 1))
    assert truncating_compare_and_append(output, written, F(4), "r1") == (F(4), True)
    assert output.upper() == F(4) and _contents(output, 3) == {("a", 1): 1}
    batches = output.state().batches
    assert [(b.lower, b.upper) for b in batches] == [(F(3), F(4))]


def test_a_time_another_replica_wrote_is_dropped_not_retried(output: Shard) -> None:
    """Invariant 4: a time the upper passed is dropped, not retried, and nothing is staged."""
    truncating_compare_and_append(output, _updates(("a", 1, 0, 1)), F(1), "r1")
    # r2 computed the same time from a stale view: the upper is there, its result is dropped
    assert truncating_compare_and_append(output, _updates(("b", 2, 0, 1)), F(1), "r2") == (
        F(1),
        False,
    )
    # and one the upper passed too: the latest upper comes back
    truncating_compare_and_append(output, _updates(), F(5), "r1")
    assert truncating_compare_and_append(output, _updates(("c", 3, 2, 1)), F(3), "r2") == (
        F(5),
        False,
    )
    assert _contents(output, 4) == {("a", 1): 1}
    assert _part_keys(output, "r2") == []  # nothing staged for a dropped write


def test_an_upper_moved_by_a_racing_replica_truncates_the_batch(
    output: Shard, s3_settings: S3Settings
) -> None:
    """Invariant 4: a replica moves the upper (with no data: nothing at those times) between
    this writer's read of the upper and its compare-and-append: the write is retried from the
    new upper, its part staged again for those bounds, the lost one deleted."""
    replica = open_shard(output.shard_id, None, s3_settings)
    original = output.compare_and_append
    raced: list[Frontier] = []

    def racing(parts: Any, expected: Frontier, new_upper: Frontier) -> Any:
        if not raced:
            raced.append(truncating_compare_and_append(replica, _updates(), F(2), "r2").upper)
        return original(parts, expected, new_upper)

    output.compare_and_append = racing  # type: ignore[method-assign]
    written = _updates(("a", 1, 2, 1), ("b", 1, 2, 1))
    assert truncating_compare_and_append(output, written, F(3), "r1") == (F(3), True)
    assert raced == [F(2)]
    assert [(b.lower, b.upper) for b in output.state().batches] == [(F(2), F(3))]
    assert _contents(output, 2) == {("a", 1): 1, ("b", 1): 1}
    # the part staged for [0, 3) was deleted: only the appended one is left
    appended = [p.key for b in output.state().batches for p in b.parts]
    assert _part_keys(output, "r1") == appended and len(appended) == 1


def _part_keys(shard: Shard, writer_id: str) -> list[str]:
    objects = shard.client.list_objects(shard.bucket, f"{shard.prefix}/parts/{writer_id}/")
    return [o.object_name for o in objects]
