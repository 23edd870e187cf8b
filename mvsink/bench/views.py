"""`mvsink bench views`: many small views on one deployment, next to the same views run as
separate deployments in the same run.

System and workload: sinks of one desired partition and one append worker, each a view of
`--keys` keys (1,000 by default) of which `--change` (10 %) change each tick, a retraction and an
insertion each, one tick a second per sink; one feeder publishes the same encoded ticks to
every sink. Two shapes of mvsink:

* *hosted N*: mint, write and append, one process each with `[service] sinks = all` (one Spark
  application for every sink's steps), serving the N sinks defined on the run's sinks topic;
* *separate M* (the baseline): M sinks, each with its own mint, write and append processes
  (`[service] sinks = one`), as many as `--separate` says (each costs a Spark driver).

Each shape reaches the store through a counting proxy of its own (`mvsink.bench.s3proxy`). After
`--warmup` ticks, over a window of `--seconds` ticks:

* updates/s made durable, every sink's together;
* freshness: a tick's publish to the first `ShardUpper` of its sink past it (append publishes
  it on the run's `frontiers` topic right after its compare-and-append); p50 and p99 of each
  sink, printed as the median sink's and the worst sink's;
* RSS: peak of the shape's process trees (Spark drivers and their Python workers included),
  in all and per sink; CPU: cores used per sink over the window;
* S3 requests per sink per tick;

then, the feed stopped and every sink durable, for `--idle` seconds: S3 requests and state
versions (each shard's seqno) per sink per hour.

Printed beside them: the marginal memory of a view (hosted RSS between the smallest and the
largest N, per added view) and the separate shape's memory per sink; the targets (per-sink p99
<= 2 s, marginal memory <= 20 MiB per view, an idle sink <= 60 state versions per hour), met or
missed, never asserted. Every sink's shard must equal its view at the end (exit 1 otherwise).
`views.json` holds the figures.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from subprocess import Popen
from typing import Any

from mvsink import Say
from mvsink.bench.compare import discard, percentile, save_figures, sink_config
from mvsink.bench.rss import RssSampler, cpu_seconds
from mvsink.bench.s3proxy import ProxyProcess
from mvsink.bench.workload import BenchError, EncodedTick, Feeder, Workload, encode_ticks
from mvsink.core.messages import ShardUpper
from mvsink.io.config import Config, Topics, state_dir
from mvsink.io.kafka import delete_topics, drain, tail_consumer
from mvsink.shard import open_shard
from mvsink.tools.demo import SERVICES, start_service, stop_services
from mvsink.tools.provision import provision

#: Targets (issue 67), printed as met or missed.
TARGET_P99_S, TARGET_MARGINAL_MIB, TARGET_IDLE_VERSIONS = 2.0, 20.0, 60.0
#: How long the shapes may take to make the last tick durable once the feed stops.
SETTLE_S = 180.0


@dataclass
class Shape:
    """One shape of the run (module docs): its sinks, processes and proxy."""

    label: str
    sinks: list[Config]
    logs: Path
    proxy: ProxyProcess
    procs: dict[str, Popen[bytes]] = field(default_factory=dict)
    #: (sink id, tick) -> when it was published and when its sink's upper passed it.
    published: dict[tuple[str, int], float] = field(default_factory=dict)
    durable: dict[tuple[str, int], float] = field(default_factory=dict)
    upper: dict[str, int] = field(default_factory=dict)


class Uppers:
    """Follows the run's `frontiers` topic on a thread: when each sink's upper passed each
    tick."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        base = shape.sinks[0]
        self.by_shard = {s.shard_id: s.sink_id for s in shape.sinks}
        self.consumer = tail_consumer(base.kafka_bootstrap, base.topics.frontiers)
        self.framing = base.framing()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="views-uppers", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        shape = self.shape
        while not self.stop.is_set():
            for _, record in drain(self.consumer, 0.1, None, framing=self.framing):
                if not isinstance(record, ShardUpper) or record.shard_id not in self.by_shard:
                    continue
                sink, now = self.by_shard[record.shard_id], time.monotonic()
                upper = record.upper.time if record.upper.time is not None else 2**62
                for tick in range(shape.upper.get(sink, 0), upper):
                    shape.durable.setdefault((sink, tick), now)
                shape.upper[sink] = max(shape.upper.get(sink, 0), upper)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.consumer.close()


def run_views(
    config: Config,
    counts: list[int],
    separate: int,
    workload: Workload,
    warmup: int,
    seconds: int,
    idle: float,
    out: Path,
    say: Say,
) -> dict[str, Any]:
    """The views benchmark (module docs); the figures, also in `out/views.json`."""
    if not counts or min(counts) < 1 or separate < 0 or seconds < 1 or warmup < 1:
        raise BenchError("views needs --views N,... >= 1, --seconds >= 1 and --warmup >= 1")
    run_id = f"views-{uuid.uuid4().hex[:6]}"
    logs = state_dir() / "bench" / run_id
    say(f"encoding {workload.ticks + 1} ticks (untimed) ...")
    ticks, _ = encode_ticks(sink_config(config, f"{run_id}-encode", 1), workload, say)
    shapes = [(f"hosted {n}", n, True) for n in sorted(set(counts))]
    if separate:
        shapes.append((f"separate {separate}", separate, False))
    figures: dict[str, Any] = {
        "run": run_id,
        "keys": workload.keys,
        "updates_per_tick": ticks[1].updates,
        "warmup": warmup,
        "seconds": seconds,
        "idle_s": idle,
        "shapes": {},
    }
    for label, n, hosted in shapes:
        say(f"{label}: {n} sink(s), {'one process per service' if hosted else 'a deployment each'}")
        figures["shapes"][label] = _run_shape(
            config, f"{run_id}-{label.replace(' ', '')}", n, hosted, ticks, workload, warmup,
            seconds, idle, logs / label.replace(" ", "-"), say,
        )  # fmt: skip
    figures.update(_verdicts(figures["shapes"]))
    _report(figures, say)
    save_figures(out, "views", figures, say, logs)
    return figures


def _run_shape(
    config: Config,
    name: str,
    n: int,
    hosted: bool,
    ticks: list[EncodedTick],
    workload: Workload,
    warmup: int,
    seconds: int,
    idle: float,
    logs: Path,
    say: Say,
) -> dict[str, Any]:
    topics = Topics.for_sink(name, f"{name}.frontiers", f"{name}.sinks")
    base = replace(config, topics=topics, partitions=1, append_workers=1)
    sinks = [sink_config(base, f"{name}-{i}", 1) for i in range(n)]
    for sink in sinks:
        provision(sink)
    proxy = ProxyProcess(config.s3.endpoint).__enter__()
    shape = Shape(name, sinks, logs, proxy)
    via = replace(config.s3, endpoint=proxy.endpoint)
    uppers = Uppers(shape)
    try:
        if hosted:
            for service in SERVICES:
                shape.procs[service] = start_service(
                    replace(base, s3=via), service, logs, MVSINK_SERVICE_SINKS="all"
                )
        else:
            for sink in sinks:
                for service in SERVICES:
                    shape.procs[f"{sink.sink_id}.{service}"] = start_service(
                        replace(sink, s3=via), service, logs / sink.sink_id
                    )
        return _measure(shape, ticks, workload, warmup, seconds, idle, say)
    finally:
        uppers.close()
        stop_services(shape.procs.values())
        proxy.__exit__(None, None, None)
        for sink in sinks:
            discard(sink)
        delete_topics(config.kafka_bootstrap, [topics.frontiers, topics.sinks])


def _measure(
    shape: Shape,
    ticks: list[EncodedTick],
    workload: Workload,
    warmup: int,
    seconds: int,
    idle: float,
    say: Say,
) -> dict[str, Any]:
    _wait_ready(shape, say)
    feeder = Feeder(shape.sinks[0].kafka_bootstrap)
    roots = {label: proc.pid for label, proc in shape.procs.items()}
    window = range(warmup, warmup + seconds)
    last = window[-1]
    sampler: RssSampler | None = None
    cpu0: dict[str, float] = {}
    started = time.monotonic()
    for tick in range(last + 1):
        due = started + tick
        time.sleep(max(0.0, due - time.monotonic()))
        if tick == window[0]:
            sampler, cpu0 = RssSampler(roots), cpu_seconds(roots)
        for sink in shape.sinks:
            feeder.feed(sink, ticks[tick])
            shape.published[(sink.sink_id, tick)] = time.monotonic()
        _check_alive(shape)
        if tick % 10 == 0:
            behind = sum(shape.upper.get(s.sink_id, 0) <= tick - 5 for s in shape.sinks)
            say(f"  tick {tick}/{last}: {behind} sink(s) more than 5 ticks behind")
    fed_end = time.monotonic()
    cpu1 = cpu_seconds(roots)
    assert sampler is not None
    rss = sampler.stop()
    deadline = fed_end + SETTLE_S
    while any(shape.upper.get(s.sink_id, 0) <= last for s in shape.sinks):
        _check_alive(shape)
        if time.monotonic() > deadline:
            raise BenchError(f"{shape.label}: the last tick not durable {SETTLE_S:.0f}s after it")
        time.sleep(0.2)
    window_start = min(shape.published[(s.sink_id, window[0])] for s in shape.sinks)
    window_end = max(shape.durable[(s.sink_id, last)] for s in shape.sinks)
    requests = shape.proxy.per_hour(window_start, window_end) or 0.0
    requests *= (window_end - window_start) / 3600
    n, updates = len(shape.sinks), sum(ticks[t].updates for t in window)
    p50s, p99s = [], []
    for sink in shape.sinks:
        lags = [
            shape.durable[(sink.sink_id, t)] - shape.published[(sink.sink_id, t)] for t in window
        ]
        p50s.append(percentile(lags, 50))
        p99s.append(percentile(lags, 99))
    idle_figures = _idle(shape, idle)
    correct = _correct(shape, workload, last)
    figures = {
        "sinks": n,
        "processes": len(shape.procs),
        "updates_per_s": round(n * updates / (window_end - window_start), 1),
        "freshness_p50_median_s": round(statistics.median(p50s), 3),
        "freshness_p99_median_s": round(statistics.median(p99s), 3),
        "freshness_p99_worst_s": round(max(p99s), 3),
        "rss_mib": round(sum(rss.values()), 1),
        "rss_mib_per_sink": round(sum(rss.values()) / n, 1),
        "cores_per_sink": round(
            sum(cpu1[k] - cpu0.get(k, 0.0) for k in cpu1) / (fed_end - window_start) / n, 4
        ),
        "s3_requests_per_sink_per_tick": round(requests / n / len(window), 2),
        **idle_figures,
        "correct": correct,
    }
    say(f"  {shape.label}: {figures}")
    return figures


def _idle(shape: Shape, idle: float) -> dict[str, Any]:
    """S3 requests and state versions per sink per hour with nothing fed, and the versions by
    what they changed (`ShardState.change`)."""
    shards = [open_shard(s.shard_id, None, s.s3) for s in shape.sinks]
    time.sleep(3.0)  # the last tick's checkpoints and lease moves
    start, seqnos = time.monotonic(), [shard.state().seqno for shard in shards]
    before = shape.proxy.snapshot()
    time.sleep(idle)
    end = time.monotonic()
    after = shape.proxy.snapshot()
    requests = {k: after[k] - before.get(k, 0) for k in after if after[k] > before.get(k, 0)}
    changes: Counter[str] = Counter()
    for shard, seqno in zip(shards, seqnos, strict=True):
        for version in range(seqno + 1, shard.state().seqno + 1):
            state = shard.version(version)
            changes[state.change if state is not None else "pruned"] += 1
    versions = sum(changes.values())
    n, hours = len(shards), (end - start) / 3600
    return {
        "idle_versions_by_change": dict(changes),
        "idle_requests_by_kind": requests,
        "idle_s3_requests_per_sink_per_hour": round(
            (shape.proxy.per_hour(start, end) or 0.0) / n, 1
        ),
        "idle_versions_per_sink_per_hour": round(versions / n / hours, 1),
    }


def _correct(shape: Shape, workload: Workload, last: int) -> bool:
    """Each sink's shard equals its view once ticks 0..`last` are applied."""
    view = workload.view_at(last)
    expected = set(
        zip(view.column("key").to_pylist(), view.column("value").to_pylist(), strict=True)
    )
    for sink in shape.sinks:
        shard = open_shard(sink.shard_id, None, sink.s3)
        upper = shard.upper()  # past `last`, nothing fed since; `since` may be there
        rows = shard.snapshot(upper).select(["key", "value", "_diff"]).to_pylist()
        if any(r["_diff"] != 1 for r in rows) or {(r["key"], r["value"]) for r in rows} != expected:
            return False
    return True


def _wait_ready(shape: Shape, say: Say, timeout: float = 300.0) -> None:
    """Until every sink's write driver logged its start (its Spark session is up)."""
    started, deadline = time.monotonic(), time.monotonic() + timeout
    while True:
        logs = "".join(log.read_text(errors="replace") for log in shape.logs.rglob("write.log"))
        if all(f"write {s.sink_id} started as" in logs for s in shape.sinks):
            break
        _check_alive(shape)
        if time.monotonic() > deadline:
            raise BenchError(f"{shape.label}: the write drivers did not start in {timeout:.0f}s")
        time.sleep(0.2)
    say(f"  every write driver started in {time.monotonic() - started:.1f}s")


def _check_alive(shape: Shape) -> None:
    for label, proc in shape.procs.items():
        if proc.poll() is not None:
            raise BenchError(f"{shape.label}: {label} exited with {proc.returncode}")


def _verdicts(shapes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    hosted = sorted((f["sinks"], f) for label, f in shapes.items() if label.startswith("hosted"))
    marginal = None
    if len(hosted) > 1 and hosted[-1][0] > hosted[0][0]:
        (n0, f0), (n1, f1) = hosted[0], hosted[-1]
        marginal = round((f1["rss_mib"] - f0["rss_mib"]) / (n1 - n0), 1)
    meeting = [n for n, f in hosted if f["freshness_p99_worst_s"] <= TARGET_P99_S]
    return {
        "marginal_mib_per_view": marginal,
        "largest_hosted_meeting_p99": max(meeting) if meeting else None,
        "idle_versions_met": all(
            f["idle_versions_per_sink_per_hour"] <= TARGET_IDLE_VERSIONS for _, f in hosted
        ),
        "correct": all(f["correct"] for f in shapes.values()),
    }


ROWS = (
    ("updates/s (all sinks)", "updates_per_s"),
    ("freshness p50, median sink (s)", "freshness_p50_median_s"),
    ("freshness p99, median sink (s)", "freshness_p99_median_s"),
    ("freshness p99, worst sink (s)", "freshness_p99_worst_s"),
    ("processes", "processes"),
    ("RSS, all processes (MiB)", "rss_mib"),
    ("RSS per sink (MiB)", "rss_mib_per_sink"),
    ("CPU per sink (cores)", "cores_per_sink"),
    ("S3 requests per sink per tick", "s3_requests_per_sink_per_tick"),
    ("S3 requests per sink per idle hour", "idle_s3_requests_per_sink_per_hour"),
    ("state versions per sink per idle hour", "idle_versions_per_sink_per_hour"),
    ("shards equal to their views", "correct"),
)


def _report(figures: dict[str, Any], say: Say) -> None:
    shapes = figures["shapes"]
    say(
        f"views: {figures['keys']:,} keys a view, {figures['updates_per_tick']:,} updates a tick, "
        f"one tick a second per view; window of {figures['seconds']} ticks after "
        f"{figures['warmup']}, idle {figures['idle_s']:.0f}s"
    )
    say(f"  {'':<40}" + "".join(f"{label:>16}" for label in shapes))
    for title, key in ROWS:
        say(f"  {title:<40}" + "".join(f"{f[key]!s:>16}" for f in shapes.values()))
    marginal = figures["marginal_mib_per_view"]
    separate = [f for label, f in shapes.items() if label.startswith("separate")]
    beside = (
        f"; separate deployments: {separate[0]['rss_mib_per_sink']} MiB a sink" if separate else ""
    )
    if marginal is None:
        say(f"  marginal memory per view: needs two hosted sizes{beside}")
    else:
        met = "met" if marginal <= TARGET_MARGINAL_MIB else "missed"
        say(
            f"  marginal memory per view: {marginal} MiB (target <= {TARGET_MARGINAL_MIB:g}: "
            f"{met}){beside}"
        )
    largest = figures["largest_hosted_meeting_p99"]
    say(
        f"  worst sink's p99 <= {TARGET_P99_S:g} s: "
        + (f"met up to {largest} hosted views" if largest else "missed at every size run")
    )
    say(
        f"  idle sink <= {TARGET_IDLE_VERSIONS:g} state versions an hour: "
        + ("met" if figures["idle_versions_met"] else "missed")
    )
