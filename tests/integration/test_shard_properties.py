"""Properties of the shard against a real S3: linearizable compare-and-append under racing
writers, `snapshot(as_of)` equal to a model of the appended history, and the Spark reader equal
to `snapshot`."""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mvsink.core.frontier import Frontier
from mvsink.io.config import S3Settings
from mvsink.shard import Appended, Shard, Timing, UpperMismatch, open_shard
from mvsink.shard.spark import read_shard

pytestmark = pytest.mark.integration

ROWS = pa.schema([("key", pa.string()), ("value", pa.int64())])
F = Frontier.at
RACE_SECONDS = float(os.environ.get("MVSINK_RACE_SECONDS", "30"))
WRITERS = 8


def _one_row(writer: int, attempt: int, time_: int) -> pa.Table:
    return pa.table({"key": [f"w{writer}"], "value": [attempt], "_time": [time_], "_diff": [1]})


def test_compare_and_append_is_linearizable_under_racing_writers(s3_settings: S3Settings) -> None:
    """8 writers with independent clients race for RACE_SECONDS; the history of state versions
    must be gap-free, every success must have advanced the upper from exactly its expected
    value, every acknowledged append must be in the final state exactly once, every rejected
    one absent, and a sequential model replaying the acknowledged appends must agree."""
    shard_id = f"race-{uuid.uuid4().hex[:10]}"
    open_shard(shard_id, ROWS, s3_settings)
    history: list[tuple[int, str, int, Appended | UpperMismatch]] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + RACE_SECONDS

    def writer(n: int) -> None:
        shard = open_shard(shard_id, ROWS, s3_settings)  # its own client, as a process would
        attempt = 0
        while time.monotonic() < stop_at:
            t = shard.upper().time
            assert t is not None
            part = shard.stage(_one_row(n, attempt, t), F(t), F(t + 1), f"w{n}")
            result = shard.compare_and_append([part], F(t), F(t + 1))
            with lock:
                history.append((n, part.key, t, result))
            attempt += 1

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    reader = open_shard(shard_id, None, s3_settings)
    final = reader.state()
    assert reader.retained_seqnos() == list(range(final.seqno + 1))  # gap-free
    versions = [reader.version(s) for s in range(final.seqno + 1)]
    for previous, version in itertools.pairwise(versions):
        assert previous is not None and version is not None and version.appended is not None
        assert version.appended.lower == previous.upper  # advanced from exactly the expected
        assert version.upper == version.appended.upper

    acked = {key: r for _, key, _, r in history if isinstance(r, Appended)}
    rejected = {key: r for _, key, _, r in history if isinstance(r, UpperMismatch)}
    committed = Counter(p.key for p in final.parts())
    assert set(committed) == set(acked) and set(committed.values()) <= {1}
    assert not set(committed) & set(rejected)

    model_upper = 0  # sequential model: replay the acknowledged appends in version order
    for key, result in sorted(acked.items(), key=lambda kv: kv[1].seqno):
        version = versions[result.seqno]
        assert version is not None and version.appended is not None
        assert [p.key for p in version.appended.parts] == [key]
        assert version.appended.lower == F(model_upper)
        model_upper += 1
        assert result.new_upper == F(model_upper)
    assert final.upper == F(model_upper)
    for _, _, expected, result in history:  # every rejection was justified by a real version
        if isinstance(result, UpperMismatch):
            seen = versions[result.seqno]
            assert seen is not None and seen.upper == result.current != F(expected)

    per_writer = Counter(n for n, _, _, r in history if isinstance(r, Appended))
    print(
        f"\n{len(history)} attempts, {len(acked)} appended, {len(rejected)} rejected, "
        f"{final.seqno} versions in {RACE_SECONDS:.0f}s; appends per writer {dict(per_writer)}"
    )
    assert len(acked) > 0 and len(per_writer) > 1


# -- snapshot vs. a model ---------------------------------------------------------------------

update = st.tuples(
    st.sampled_from("abcde"), st.integers(0, 2), st.integers(0, 2), st.integers(-3, 3).filter(bool)
)
batch = st.tuples(st.integers(1, 3), st.lists(update, max_size=8), st.booleans())


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(batch, min_size=1, max_size=5), data=st.data())
def test_snapshot_equals_the_model_of_the_appended_history(
    s3_settings: S3Settings, batches: list[Any], data: st.DataObject
) -> None:
    """`snapshot(as_of)` == consolidation of every appended update with time < as_of."""
    shard = open_shard(f"model-{uuid.uuid4().hex[:10]}", ROWS, s3_settings)
    model: Counter[tuple[str, int]] = Counter()
    history: list[tuple[str, int, int, int]] = []
    lower = 0
    for width, ups, gap in batches:
        if gap:  # an upper advance without data
            lower = shard.advance_upper(F(lower + 1)).time or 0
        upper = lower + width
        rows = [(k, v, lower + min(off, width - 1), d) for k, v, off, d in ups]
        history.extend(rows)
        table = pa.table(
            {
                "key": [r[0] for r in rows],
                "value": [r[1] for r in rows],
                "_time": [r[2] for r in rows],
                "_diff": [r[3] for r in rows],
            },
            schema=pa.schema(
                [
                    ("key", pa.string()),
                    ("value", pa.int64()),
                    ("_time", pa.int64()),
                    ("_diff", pa.int64()),
                ]
            ),
        )
        part = shard.stage(table, F(lower), F(upper), "w")
        assert shard.compare_and_append([part], F(lower), F(upper)) == Appended(
            F(upper), shard.state().seqno
        )
        lower = upper
    as_of = data.draw(st.integers(0, lower), label="as_of")
    model = Counter()
    for key, value, t, diff in history:
        if t < as_of:
            model[(key, value)] += diff
    expected = {k: d for k, d in model.items() if d != 0}
    snapshot = shard.snapshot(as_of).to_pylist()
    assert {(r["key"], r["value"]): r["_diff"] for r in snapshot} == expected
    assert all(r["_time"] == as_of - 1 and r["_err"] is None for r in snapshot)
    assert len(snapshot) == len(expected)  # consolidated: one row per (row, err)


def test_spark_reader_equals_snapshot(spark: Any, s3_settings: S3Settings) -> None:
    shard: Shard = open_shard(f"spark-{uuid.uuid4().hex[:10]}", ROWS, s3_settings, Timing())
    for t in range(4):
        rows = [(f"k{i % 5}", i % 3, t, 1 if (i + t) % 4 else -1) for i in range(50)]
        table = pa.table(
            {
                "key": [r[0] for r in rows],
                "value": pa.array([r[1] for r in rows], pa.int64()),
                "_time": pa.array([r[2] for r in rows], pa.int64()),
                "_diff": pa.array([r[3] for r in rows], pa.int64()),
            }
        )
        shard.compare_and_append([shard.stage(table, F(t), F(t + 1), f"w{t % 2}")], F(t), F(t + 1))
    for as_of in (0, 2, 4):
        expected = sorted(tuple(r.values()) for r in shard.snapshot(as_of).to_pylist())
        with read_shard(spark, shard.shard_id, as_of, s3_settings) as frame:
            got = sorted(tuple(r) for r in frame.collect())
        assert got == expected, as_of
