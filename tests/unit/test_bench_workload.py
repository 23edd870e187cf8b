"""The benchmark's pure parts: the generated workload is a valid changelog whose sum is the
final view, durable ticks are counted from reported offsets exactly, and a steady window
bounded by time ends with the ticks published before it ran out."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from mvsink.bench.compare import REGISTRY_FRAMED, Variant, drive, percentile, variants
from mvsink.bench.contenders import OffsetSystem, Run, System
from mvsink.bench.workload import EncodedTick, Workload
from mvsink.io.config import Config, load_config


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


def _offline_config(tmp_path: Path) -> Config:
    env = {
        "MVSINK_KAFKA_BOOTSTRAP": "127.0.0.1:9",
        "MVSINK_S3_ENDPOINT": "127.0.0.1:9",
        "MVSINK_S3_ACCESS_KEY": "k",
        "MVSINK_S3_SECRET_KEY": "s",
        "MVSINK_STATE_DIR": str(tmp_path),
    }
    return load_config(env=env)


def _offset_system(tmp_path: Path) -> OffsetSystem:
    return OffsetSystem(_offline_config(tmp_path), tmp_path)


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


class _Instant(System):
    """A system for which each tick is durable a fixed time after it is fed."""

    name = "instant"

    def __init__(self, tmp_path: Path, delay: float) -> None:
        super().__init__(_offline_config(tmp_path), tmp_path)
        self.delay = delay
        self.fed: list[float] = []

    def start(self) -> None: ...

    def ready(self, timeout: float = 600.0) -> None: ...

    def durable(self, wait: float = 0.0) -> int:
        time.sleep(min(wait, 0.005))
        now = time.monotonic()
        return sum(1 for at in self.fed if now - at >= self.delay)

    def finish(self, run: Run, final: pa.Table) -> None: ...


class _Feeder:
    def __init__(self, system: _Instant) -> None:
        self.system = system

    def feed(self, config: Any, tick: EncodedTick) -> dict[int, int]:
        self.system.fed.append(time.monotonic())
        return {}


def _ticks(n: int) -> list[EncodedTick]:
    return [EncodedTick(t, 10, [], b"") for t in range(n)]


def test_a_window_bounded_by_time_stops_publishing_when_it_ends(tmp_path: Path) -> None:
    system = _Instant(tmp_path, delay=0.02)
    run = drive(system, _Feeder(system), _ticks(500), 2, lambda _: None, seconds=0.3)  # type: ignore[arg-type]
    assert 3 < run.ticks < 500
    assert len(system.fed) == run.ticks  # every tick published was waited for
    assert run.steady_updates == 10 * (run.ticks - 1)
    assert len(run.freshness) == run.ticks - 1
    assert run.steady_s >= 0.3


def test_an_unbounded_window_publishes_every_tick(tmp_path: Path) -> None:
    system = _Instant(tmp_path, delay=0.0)
    run = drive(system, _Feeder(system), _ticks(30), 2, lambda _: None)  # type: ignore[arg-type]
    assert run.ticks == 30 and run.steady_updates == 290
