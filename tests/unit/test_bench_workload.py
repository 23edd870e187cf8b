"""The benchmark's pure parts: the generated workload is a valid changelog whose sum is the
final view, and durable ticks are counted from reported offsets exactly."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from mvsink.bench.compare import REGISTRY_FRAMED, Variant, percentile, variants
from mvsink.bench.contenders import OffsetSystem
from mvsink.bench.workload import Workload
from mvsink.io.config import load_config


@pytest.mark.parametrize(("keys", "change", "ticks"), [(10, 0.1, 5), (1000, 0.1, 4), (50, 1.0, 3)])
def test_the_changelog_sums_to_the_final_view(keys: int, change: float, ticks: int) -> None:
    workload = Workload(keys, change, ticks, partitions=4)
    tables, final = workload.generate()
    assert len(tables) == ticks + 1 and tables[0].num_rows == keys
    total: Counter[tuple[str, int]] = Counter()
    for tick, table in enumerate(tables):
        assert set(table.column("_time").to_pylist()) == {tick}
        if tick:  # a retraction and an insertion per changed key
            assert table.num_rows == 2 * workload.changed
        for row in table.to_pylist():
            total[(row["key"], row["value"])] += row["_diff"]
    expected = set(
        zip(final.column("key").to_pylist(), final.column("value").to_pylist(), strict=True)
    )
    assert {k for k, d in total.items() if d} == expected
    assert all(d in (0, 1) for d in total.values())


def test_ticks_do_not_share_buffers_with_later_ticks() -> None:
    """A tick's table never shares the numpy buffer a later tick changes in place."""
    tables, _ = Workload(100, 1.0, 2, 4).generate()
    assert set(tables[0].column("value").to_pylist()) == {1}


def _offset_system(tmp_path: Path) -> OffsetSystem:
    env = {
        "MVSINK_KAFKA_BOOTSTRAP": "127.0.0.1:9",
        "MVSINK_S3_ENDPOINT": "127.0.0.1:9",
        "MVSINK_S3_ACCESS_KEY": "k",
        "MVSINK_S3_SECRET_KEY": "s",
        "MVSINK_STATE_DIR": str(tmp_path),
    }
    return OffsetSystem(load_config(env=env), tmp_path)


def test_durable_ticks_need_every_partition_past_the_ticks_end(tmp_path: Path) -> None:
    system = _offset_system(tmp_path)
    system.ends = {0: {0: 5, 1: 3}, 1: {0: 9, 1: 7}, 2: {0: 12, 1: 7}}
    system.offsets = {0: 9, 1: 3}
    assert system.durable() == 1
    system.offsets[1] = 7
    assert system.durable() == 2
    system.offsets[0] = 12
    assert system.durable() == 3


def test_durable_waits_for_the_next_line_not_longer(tmp_path: Path) -> None:
    """`durable(wait)` blocks until the process reports a line (the bench's loop blocks instead
    of polling), and a line reported before the call is not waited for."""
    system = _offset_system(tmp_path)
    system.ends = {0: {0: 5}}

    def report() -> None:
        system.offsets[0] = 5
        system._heard()

    timer = threading.Timer(0.2, report)
    timer.start()
    started = time.monotonic()
    assert system.durable(wait=30) == 1
    assert time.monotonic() - started < 30
    timer.join()
    system.ends[1] = {0: 9}
    system.offsets[0] = 9
    system._heard()
    started = time.monotonic()
    assert system.durable(wait=30) == 2
    assert time.monotonic() - started < 30
    assert system.durable() == 2  # no wait: counts at once


def test_percentile() -> None:
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(101)], 99) == 99.0
    assert percentile([], 50) != percentile([], 50)  # nan


def test_the_registry_column_is_mvsink_on_the_registry_framing() -> None:
    """`--systems mvsink,mvsink-registry`: two mvsink columns, the second registry-framed, on
    the same Spark master; the end-to-end columns stay fed from DataFrames."""
    assert variants(("mvsink", REGISTRY_FRAMED, "peer-e2e"), "spark://m:7077", ()) == [
        Variant("mvsink", "mvsink", "spark://m:7077"),
        Variant(REGISTRY_FRAMED, "mvsink", "spark://m:7077", registry_framed=True),
        Variant("peer-e2e", "peer", from_dataframes=True),
    ]
