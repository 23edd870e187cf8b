"""`mvsink.bench.compare.drive` on a simulated clock: the steady window keeps at most
`in_flight` ticks published and not durable, the sustained window after it at most its own
depth; each window's ticks, updates and freshness are its own, and a system that batches what
is in flight takes more updates a second in the deeper window, up to in proportion to its depth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from mvsink.bench import compare
from mvsink.bench.compare import Sustained, drive
from mvsink.bench.contenders import Run, System
from mvsink.bench.workload import EncodedTick


class Clock:
    """Stands in for the `time` module inside `drive`: only `durable(wait)` moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1e9 + self.now


class Batching(System):
    """Makes durable, `latency` seconds after it starts, every tick fed while it was idle:
    one batch at a time, as a sink whose cycle takes what arrived meanwhile."""

    def __init__(self, clock: Clock, latency: float) -> None:
        super().__init__(config=None, logs=Path("."))  # type: ignore[arg-type]
        self.clock, self.latency = clock, latency
        self.fed = 0
        self.done = 0
        self.batch: tuple[int, float] | None = None  # (ticks it makes durable, when)

    def start(self) -> None:
        pass

    def ready(self, timeout: float = 600.0) -> None:
        pass

    def durable(self, wait: float = 0.0) -> int:
        self.clock.now += wait
        if self.batch and self.batch[1] <= self.clock.now:
            self.done, self.batch = self.batch[0], None
        if self.batch is None and self.fed > self.done:
            self.batch = (self.fed, self.clock.now + self.latency)
        return self.done

    def finish(self, run: Run, final: pa.Table) -> None:
        pass


class Feeder:
    """Feeds a tick by counting it, noting how many were in flight once it was."""

    def __init__(self, system: Batching) -> None:
        self.system = system
        self.depths: list[int] = []

    def feed(self, config: Any, tick: EncodedTick) -> dict[int, int]:
        self.system.fed += 1
        self.depths.append(self.system.fed - self.system.done)
        return {}


def ticks(count: int) -> list[EncodedTick]:
    return [EncodedTick(t, 1000 if t else 50_000, [], b"") for t in range(count)]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(compare, "time", clock)
    return clock


@pytest.mark.parametrize("in_flight,deeper", [(1, 4), (2, 8), (3, 3)])
def test_each_window_keeps_to_its_depth_and_counts_its_own_ticks(
    clock: Clock, in_flight: int, deeper: int
) -> None:
    system = Batching(clock, latency=0.2)
    feeder = Feeder(system)
    workload = ticks(400)
    run = drive(
        system,
        feeder,  # type: ignore[arg-type]
        workload,
        in_flight,
        lambda _: None,
        seconds=5.0,
        sustained=Sustained(deeper, 5.0),
    )
    steady = feeder.depths[1 : 1 + run.steady_ticks]
    sustained = feeder.depths[1 + run.steady_ticks :]
    assert max(steady) == in_flight and max(sustained) == deeper
    assert run.ticks == 1 + run.steady_ticks + run.sustained_ticks == len(feeder.depths)
    assert run.steady_ticks > 0 and run.sustained_ticks > 0 and run.ticks < len(workload)
    assert run.steady_updates == 1000 * run.steady_ticks
    assert run.sustained_updates == 1000 * run.sustained_ticks
    assert len(run.freshness) == run.steady_ticks
    assert len(run.sustained_freshness) == run.sustained_ticks
    # each window ends once the ticks it published before its bound are durable
    assert 5.0 <= run.steady_s <= 5.0 + 2 * 0.2 + 0.1
    assert 5.0 <= run.sustained_s <= 5.0 + 2 * 0.2 + 0.1
    # a batch takes what is in flight: the deeper loop takes more a second, up to in
    # proportion (a batch starts on the system's next poll, so a shallow loop idles more)
    ratio = run.sustained_updates_per_s / run.updates_per_s
    assert 0.5 * deeper / in_flight <= ratio <= 1.25 * deeper / in_flight


def test_without_a_sustained_window_or_ticks_left_for_one_there_is_none(clock: Clock) -> None:
    system = Batching(clock, latency=0.2)
    plain = drive(system, Feeder(system), ticks(400), 2, lambda _: None, seconds=2.0)  # type: ignore[arg-type]
    assert plain.sustained_ticks == 0 and plain.sustained_s == 0.0
    assert plain.sustained_updates_per_s == 0.0 and plain.ticks == 1 + plain.steady_ticks
    system = Batching(clock, latency=0.2)
    workload = ticks(30)  # the steady window takes every tick before its bound
    ran_out = drive(
        system,
        Feeder(system),  # type: ignore[arg-type]
        workload,
        2,
        lambda _: None,
        seconds=60.0,
        sustained=Sustained(8, 5.0),
    )
    assert ran_out.steady_ticks == 29 and ran_out.sustained_ticks == 0
    assert ran_out.ticks == len(workload)
