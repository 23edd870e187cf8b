"""`mvsink bench pipeline`: sustained updates/s through mint + write (Spark) + append, and
freshness (desired progress -> shard upper) p50/p99, with the producer's own rate (publishing
alone, no sink) from the same run as the baseline.

Workload: `keys` rows; each tick changes `change` of them (retraction + insertion), ticks as
fast as the producer publishes them, for `seconds`.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace

import pyarrow as pa

from mvsink import Say
from mvsink.core.frontier import Frontier
from mvsink.core.rows import parse_row_schema
from mvsink.io.config import Config, Topics, state_dir
from mvsink.shard import open_shard
from mvsink.tools.demo import start_services
from mvsink.tools.provision import provision
from mvsink.upstream.producer import DesiredProducer

ROW_SCHEMA = "key string not null, value long"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return (
        ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]
        if ordered
        else float("nan")
    )


def _tick(rng: random.Random, values: list[int], tick: int, change: float) -> pa.Table:
    chosen = rng.sample(range(len(values)), max(1, int(len(values) * change)))
    rows: list[tuple[str, int, int]] = []  # (key, value, diff) at time `tick`
    for i in chosen:
        if values[i]:
            rows.append((f"key-{i}", values[i], -1))  # retraction
        values[i] += 1
        rows.append((f"key-{i}", values[i], 1))  # insertion
    return pa.table(
        {
            "key": [r[0] for r in rows],
            "value": [r[1] for r in rows],
            "_time": [tick] * len(rows),
            "_diff": [r[2] for r in rows],
        }
    )


def _publish(
    config: Config,
    seconds: float,
    keys: int,
    change: float,
    on_advance: Callable[[int, float], None],
    interval: float = 0.0,
) -> tuple[int, int]:
    """Publish ticks for `seconds`, one every `interval` seconds (0: back to back);
    (updates sent, final frontier)."""
    producer = DesiredProducer(config, parse_row_schema(ROW_SCHEMA), f"bench.{config.sink_id}")
    tick = producer.start().time or 0
    rng, values, sent = random.Random(1), [0] * keys, 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.monotonic()
        sent += producer.send(_tick(rng, values, tick, change))
        tick += 1
        producer.advance_to(Frontier.at(tick))
        on_advance(tick, time.monotonic())
        time.sleep(max(0.0, interval - (time.monotonic() - started)))
    return sent, tick


def run(
    config: Config, seconds: float, keys: int, change: float, say: Say, interval: float = 0.0
) -> dict[str, float]:
    """Run the benchmark; the figures. `interval` paces the ticks (0: as fast as possible, so
    freshness then measures backlog; > 0: steady-state freshness at that tick rate)."""
    run_id = f"bench-{uuid.uuid4().hex[:6]}"
    sink = replace(
        config,
        sink_id=run_id,
        shard_id=run_id,
        row_schema=ROW_SCHEMA,
        topics=Topics.for_sink(run_id, config.topics.frontiers),
    )
    baseline = replace(sink, sink_id=f"{run_id}-base", topics=Topics.for_sink(f"{run_id}-base"))
    for each in (sink, baseline):
        provision(each)
    say(f"baseline: the producer alone for {seconds:.0f}s ({keys} keys, {change:.0%} per tick)")
    base_sent, _ = _publish(baseline, seconds, keys, change, lambda t, at: None)
    shard = open_shard(sink.shard_id, None, sink.s3)
    procs = start_services(sink, state_dir() / "bench" / run_id)
    advanced: dict[int, float] = {}
    reached: dict[int, float] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            upper, now = shard.upper().time or 0, time.monotonic()
            for t in [t for t in advanced if t <= upper and t not in reached]:
                reached[t] = now
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        time.sleep(15)  # services up (Spark driver start), not measured
        say(f"pipeline: publishing for {seconds:.0f}s through mint + write + append")
        started = time.monotonic()
        sent, final = _publish(sink, seconds, keys, change, advanced.__setitem__, interval)
        while final not in reached and time.monotonic() - started < seconds + 300:
            time.sleep(0.2)
        finished = reached.get(final, time.monotonic())
    finally:
        stop.set()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(60)
    fresh = [reached[t] - advanced[t] for t in advanced if t in reached]
    figures = {
        "pipeline_updates_per_s": sent / (finished - started),
        "producer_only_updates_per_s": base_sent / seconds,
        "tick_interval_s": interval,
        "freshness_p50_s": _percentile(fresh, 50),
        "freshness_p99_s": _percentile(fresh, 99),
        "ticks": float(len(advanced)),
        "converged": float(final in reached),
    }
    say(
        f"{'sustained updates/s through the pipeline':<44} {figures['pipeline_updates_per_s']:>12,.0f}"
    )
    say(
        f"{'baseline: producer alone (same run)':<44} {figures['producer_only_updates_per_s']:>12,.0f}"
        f"   ratio x{figures['pipeline_updates_per_s'] / figures['producer_only_updates_per_s']:.2f}"
    )
    if interval > 0:
        say(f"(ticks paced at one per {interval}s: the throughput above is the offered load)")
    say(f"{'freshness p50 (desired progress -> upper)':<44} {figures['freshness_p50_s']:>12.2f} s")
    say(f"{'freshness p99':<44} {figures['freshness_p99_s']:>12.2f} s")
    say(f"{'ticks / converged':<44} {len(advanced):>12} / {final in reached}")
    return figures
