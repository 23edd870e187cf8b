"""`mvsink bench`: mvsink side by side with the peers a user would build instead and with the raw
limit, on the same workload, in one run.

Workload: a view of `keys` rows `(key string, value long)`; tick 0 inserts every key, each later
tick changes `change` of the keys (a retraction and an insertion each). The ticks are generated
and encoded once (`DesiredRecord` v2 chunks, partitioned as the producer does) before anything
is timed, and the *same bytes* are published to each system's own desired topic, followed by
the in-band `Progress` of the tick (and, for mvsink, `DesiredProgress` in `frontiers`).

Ticks go "as fast as the system takes them": closed loop, at most `in_flight` ticks published
and not yet durable. Durable means: mvsink's shard upper passed the tick; the peer finished
the micro-batch holding the tick's progress record (for delta: merged it); the raw loops wrote
the tick's Parquet.

At the default depth of 2 a system's updates/s is about two ticks per tick latency: it
measures freshness at light load more than what the system can take. So each system fed the
encoded ticks (not the end-to-end columns, whose upstream holds one window's ticks) then runs
a *sustained* window (`Sustained`: `--sustained-in-flight`, default 8, for
`--sustained-seconds`) on the ticks left, once every tick of the steady one is durable: with
more ticks in flight, an mvsink description or a peer's micro-batch covers several, and the
updates/s of that window is what the system sustains when the offered load lets it batch
(its freshness there includes the queue). docs/decisions.md argues the two figures.

Systems, one after the other (never two at once on this box):
1. mvsink: mint + write (Spark) + append, P partitions, A append workers; its write service on
   `local[*]`, on `--spark-master`, or once per size of `--spark-workers` (e.g. `0,1,2`: local,
   then the embedded standalone cluster scaled to 1 and 2 workers; columns `mvsink`,
   `mvsink-1w`, `mvsink-2w`, side by side on the same workload);
2. peer: Structured Streaming, Kafka source -> `foreachBatch` -> Parquet (`mvsink.bench.systems`);
3. delta: Structured Streaming, Kafka source -> `foreachBatch` -> consolidate -> Delta `MERGE`
   by key into a Delta table on S3A (`mvsink.bench.systems`; figure `ratio_vs_delta`); its
   table is read at the end and must equal the view;
4. raw: a consume-and-write loop per partition (`mvsink.bench.systems`).
5. mvsink-e2e and peer-e2e: mvsink and the peer again, fed the way an upstream Spark job feeds
   them: each tick's updates are a DataFrame read from a Parquet file, published from the
   executors with `mvsink.upstream.publish.publish_dataframe` (reading, partitioning, encoding
   and producing are timed), so their updates/s and freshness run from the upstream's source to
   durable
   (`workload.DataFrameFeeder`; figure `ratio_e2e_vs_peer_e2e`). Before the first of them,
   the upstream publishes every tick to scratch topics, untimed, pass after pass until its
   JVM's JIT compiler has mostly settled, so both are measured on a warm upstream JVM, in
   every repeat (`DataFrameFeeder.warm_up`).

The producer's own rate is printed too: how fast `DesiredProducer` turned the workload into
records when it was encoded, per CPU second, next to partitioning 1 on a sample of the same
updates (`producer_updates_per_cpu_s`, `producer_v1_updates_per_cpu_s`).

Before the first repeat, the broker is warmed up (`--warm-up`, default 60 s): mvsink runs
untimed on a scratch sink, fed the ticks closed loop, until that long has passed after its
initial load or the ticks run out. A broker just started spends its first minute or so of
traffic at about twice the CPU of a warm one (its JVM compiling), which would otherwise fall
on the first column of the first repeat. mvsink's traffic is a superset of the other
columns': the same produce and fetch of desired, and also transactions (mint's descriptions,
read-committed readers) and the compacted `frontiers` (docs/decisions.md has the figures).

Each system is started and waited for until it can take input (`System.ready`: mvsink's write
service has its Spark session, a peer its streaming query, raw its consumers): the process
start. Then tick 0 (the initial load) is published and timed on its own: the hydration, set
against one plain read of the same load (`systems.read_load`: consumed from a desired topic of
its own and decoded into Arrow, nothing written), timed before each repeat. The steady-state
ticks 1..N give updates/s and freshness (tick published -> durable) p50/p99. Also measured: peak
RSS of every process tree; the CPU cores each tree used over the steady window, and the
embedded stack's components beside them (Kafka, MinIO, a Spark cluster: `stack`), so updates
per CPU second set a system's throughput against what it costs, not only against the box (the
bench's own feeder, and the end-to-end columns' upstream in it, are not counted); bytes read
back per byte written (mvsink's write metrics; the Delta peer's S3A reads; the others never read
back), the table's size in the bucket at the end (mvsink, delta), and whether the shard and the
Delta table equal the view; and for mvsink, where a description's cycle went (`cycle`: its
phases from the services' logs, medians over the steady window). Writes `bench.json` and
`bench.png` into `--out`. How each system is driven (started, asked, finished) is
`mvsink.bench.contenders`.

Once a column's figures are taken, its sink is discarded (`discard`): its topics and its
objects in the bucket, gigabytes a column (its desired topic keeps everything it is fed). The
logs stay. `--keep-data` keeps them too, to inspect a run's topics and shards.
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from mvsink import Say
from mvsink.bench.contenders import (
    DeltaSystem,
    MvsinkSystem,
    PeerSystem,
    RawSystem,
    Run,
    System,
)
from mvsink.bench.cycle import describe
from mvsink.bench.repeats import cell, summarise
from mvsink.bench.rss import RssSampler, cpu_seconds
from mvsink.bench.workload import (
    ROW_SCHEMA,
    BenchError,
    DataFrameFeeder,
    EncodedTick,
    Feeder,
    Workload,
    encode_ticks_timed,
)
from mvsink.io.config import Config, Topics, state_dir
from mvsink.io.kafka import delete_topics
from mvsink.io.sinks import forget
from mvsink.tools.provision import provision
from mvsink.tools.sinks import own_topics, purge_objects

SYSTEMS = ("mvsink", "peer", "delta", "raw", "mvsink-e2e", "peer-e2e")
#: Columns run only when named (`--systems`): mvsink with every record in the Schema Registry
#: wire format (the desired topic framed by the producer, the services framing theirs).
OPTIONAL_SYSTEMS = ("mvsink-registry",)
#: The column of mvsink on the Schema Registry's framing.
REGISTRY_FRAMED = "mvsink-registry"
HEADINGS = {
    "mvsink": "mvsink",
    "peer": "peer (Spark SS)",
    "delta": "Delta MERGE",
    "raw": "raw limit",
    "mvsink-e2e": "mvsink end to end",
    "peer-e2e": "peer end to end",
    REGISTRY_FRAMED: "mvsink (registry)",
}
#: Columns fed from the upstream's DataFrames (`DataFrameFeeder`) instead of encoded bytes.
END_TO_END = "-e2e"


@dataclass(frozen=True)
class Variant:
    """One column of the table: a system, and for mvsink where its write service's Spark runs."""

    name: str
    system: str
    spark_master: str | None = None
    #: Scale the embedded Spark cluster to this many workers before starting (0: local[*]).
    spark_workers: int | None = None
    #: Fed from the upstream job's DataFrames (`publish_dataframe`), not pre-encoded bytes.
    from_dataframes: bool = False
    #: Every record in the Schema Registry wire format (`REGISTRY_FRAMED`).
    registry_framed: bool = False


def variants(
    systems: tuple[str, ...], spark_master: str | None, spark_workers: tuple[int, ...]
) -> list[Variant]:
    """The columns for `systems`: mvsink once per `spark_workers` size (or on `spark_master`)."""
    found: list[Variant] = []
    for system in systems:
        if system.endswith(END_TO_END):
            found.append(Variant(system, system.removesuffix(END_TO_END), from_dataframes=True))
        elif system == REGISTRY_FRAMED:
            found.append(Variant(system, "mvsink", spark_master, registry_framed=True))
        elif system != "mvsink":
            found.append(Variant(system, system))
        elif spark_workers:
            found.extend(
                Variant("mvsink" if i == 0 else f"mvsink-{n}w", "mvsink", None, n)
                for i, n in enumerate(spark_workers)
            )
        else:
            found.append(Variant("mvsink", "mvsink", spark_master))
    return found


#: How long `drive` blocks for a system's next report before it checks the processes again.
BLOCK = 0.05


@dataclass(frozen=True)
class Sustained:
    """The sustained window `drive` runs after the steady one: at most `in_flight` ticks
    published and not yet durable, for `seconds` (module docs)."""

    in_flight: int
    seconds: float


def drive(
    system: System,
    feeder: Feeder | DataFrameFeeder,
    ticks: list[EncodedTick],
    in_flight: int,
    say: Say,
    stall: float = 300.0,
    seconds: float | None = None,
    cpu: Callable[[], dict[str, float]] | None = None,
    sustained: Sustained | None = None,
) -> Run:
    """Publish the ticks closed-loop and time them (see the module docs). The ticks may start
    at any time (a later segment of a workload): counts are relative to the first one. With
    `seconds`, no tick is published once the steady window has run that long: the window ends
    with the last tick published before then (`Run.steady_ticks` says how many were). `cpu()`,
    read when each window starts and ends, gives `Run.cpu_cores`: CPU seconds per second of
    the window, by the labels it returns. With `sustained`, the ticks left after the steady
    window are fed in a second window, at its deeper closed loop and for its seconds, once
    every tick of the first is durable (`Run.sustained_*`)."""
    run = Run(system.name)
    base = ticks[0].time
    sent: dict[int, float] = {}
    reached: dict[int, float] = {}
    last_progress = time.monotonic()

    def wait_for(count: int) -> None:
        nonlocal last_progress
        while True:
            durable = system.durable(wait=BLOCK) - base
            now = time.monotonic()
            for t in range(len(reached), min(durable, len(sent))):
                reached[t] = now
                last_progress = now
            if len(reached) >= count:
                return
            system.check_alive()
            if now - last_progress > stall:
                raise BenchError(
                    f"{system.name} made no progress for {stall:.0f}s at tick {len(reached)} "
                    f"(logs in {system.logs})"
                )

    def window(depth: int, limit: float | None) -> tuple[float, float, dict[str, float]]:
        """Feed the ticks not yet fed, at most `depth` not durable, until `limit` seconds
        have passed or they run out; once every tick fed is durable: when the window started
        and its last tick was durable, and the CPU cores it used."""
        cpu_start = cpu() if cpu else {}
        start = time.monotonic()
        for tick in ticks[len(sent) :]:
            wait_for(tick.time - base - depth + 1)
            if limit is not None and time.monotonic() - start >= limit:
                break
            system.ends[tick.time] = feeder.feed(system.config, tick)
            sent[tick.time - base] = time.monotonic()
        wait_for(len(sent))
        cores: dict[str, float] = {}
        if cpu:
            cpu_end, length = cpu(), time.monotonic() - start
            cores = {
                label: round((used - cpu_start.get(label, 0.0)) / length, 3)
                for label, used in cpu_end.items()
            }
        return start, reached[len(sent) - 1], cores

    started = time.monotonic()
    system.ends[base] = feeder.feed(system.config, ticks[0])
    sent[0] = time.monotonic()
    last_progress = sent[0]
    wait_for(1)
    run.initial_load_s, run.load_publish_s = reached[0] - started, sent[0] - started
    say(
        f"  {system.name}: initial load of {ticks[0].updates:,} updates published in "
        f"{run.load_publish_s:.1f}s, durable in {run.initial_load_s:.1f}s"
    )
    steady_start, steady_end, run.cpu_cores = window(in_flight, seconds)
    fed = len(sent)
    run.steady_ticks = fed - 1
    run.steady_s = steady_end - steady_start
    wall = time.time() - time.monotonic()  # monotonic -> the services' log clock
    run.steady_wall = (steady_start + wall, steady_end + wall)
    run.steady_updates = sum(t.updates for t in ticks[1:fed])
    run.freshness = [reached[t] - sent[t] for t in range(1, fed)]
    if sustained is not None and fed < len(ticks):
        start, end, run.sustained_cpu_cores = window(sustained.in_flight, sustained.seconds)
        run.sustained_ticks = len(sent) - fed
        run.sustained_s = end - start
        run.sustained_updates = sum(t.updates for t in ticks[fed : len(sent)])
        run.sustained_freshness = [reached[t] - sent[t] for t in range(fed, len(sent))]
    run.ticks = len(sent)
    run.tick_times = [(sent[t], reached[t]) for t in range(len(sent))]
    return run


# -- the run --------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def sink_config(config: Config, name: str, partitions: int, **changes: Any) -> Config:
    """A benchmark's sink `name`: the workload's rows, its own shard (unless `shard_id` is
    given) and topics, and any other `changes`."""
    return replace(
        config,
        sink_id=name,
        shard_id=changes.pop("shard_id", name),
        row_schema=ROW_SCHEMA,
        partitions=partitions,
        topics=Topics.for_sink(name, config.topics.frontiers, config.topics.sinks),
        **changes,
    )


def provisioned(base: Config, sink_id: str, spark_master: str | None = None) -> Config:
    """A sink of the run (`sink_config`), its topics created."""
    sink = sink_config(
        base, sink_id, base.partitions, spark_master=spark_master or base.spark_master
    )
    provision(sink)
    return sink


def run(
    config: Config,
    workload: Workload,
    out: Path,
    say: Say,
    in_flight: int = 2,
    systems: tuple[str, ...] = SYSTEMS,
    append_workers: int = 2,
    wire: str = "arrow",
    spark_master: str | None = None,
    spark_workers: tuple[int, ...] = (),
    scale: Callable[[int], str | None] | None = None,
    schema_registry: Callable[[], str] | None = None,
    repeats: int = 1,
    seconds: float | None = None,
    keep_data: bool = False,
    stack: Callable[[], dict[str, int]] | None = None,
    warm_up: float = 0.0,
    sustained: Sustained | None = None,
) -> dict[str, Any]:
    """Run the benchmark; the figures (also written to `out/bench.json` and `out/bench.png`).
    `scale(n)` runs the embedded Spark cluster with `n` workers (its master URL);
    `schema_registry()` the URL of a Schema Registry for the `REGISTRY_FRAMED` column (else
    `config.schema_registry_url`), which gets the same workload encoded in its wire format.
    Without that column every column frames records as `config` says; with it, the others use
    mvsink's own framing, so the column compares the two. The columns run `repeats` times,
    interleaved, each on a new sink; `seconds` bounds each steady window (`drive`). Each
    sink is discarded once its figures are taken, unless `keep_data`. `stack()` names the
    pids of the embedded stack's running components, whose CPU each column's figures count
    beside its own processes'. `warm_up` seconds of mvsink, untimed, warm the broker
    before the first repeat (module docs). With `sustained`, each column fed the encoded
    ticks runs a sustained window after its steady one (`drive`). The figures are
    `mvsink.bench.repeats.summarise` of every repeat's."""
    if repeats < 1:
        raise BenchError(f"--repeats must be at least 1, not {repeats}")
    run_id = f"cmp-{uuid.uuid4().hex[:6]}"
    logs = state_dir() / "bench" / run_id
    base = replace(
        config,
        row_schema=ROW_SCHEMA,
        partitions=workload.partitions,
        append_workers=append_workers,
        partitioning=1 if wire == "avro" else config.partitioning,
    )
    framed_url = ""
    if REGISTRY_FRAMED in systems:
        framed_url = schema_registry() if schema_registry else config.schema_registry_url
        if not framed_url:
            raise BenchError(
                f"{REGISTRY_FRAMED} needs a Schema Registry: [kafka] schema_registry_url"
            )
        base = replace(base, schema_registry_url="")
    ticks, final, producer_rate = encode_ticks_timed(base, workload, say, wire)
    if {"peer", "delta"} & set(systems):
        from mvsink.bench.systems import delta_jars, peer_jars

        peer_jars(say)  # resolve before timing anything
        if "delta" in systems:
            delta_jars(say)
    columns = variants(systems, spark_master, spark_workers)
    column = _Columns(
        base, workload, wire, ticks, final, in_flight, logs, run_id, say, seconds, keep_data, stack
    )
    column.sustained = sustained
    per_repeat: list[dict[str, Any]] = []
    warmed = 0.0
    try:  # the upstream's tick files and scratch sinks go however the run ends
        if warm_up > 0:
            warmed = column.warm_up_broker(warm_up)
        for repeat in range(repeats):
            if repeats > 1:
                say(f"repeat {repeat + 1} of {repeats}: {', '.join(v.name for v in columns)}")
            runs: dict[str, Run] = {}
            column.read_load(repeat)
            for variant in columns:
                master = variant.spark_master
                if variant.spark_workers is not None:
                    if scale is None:
                        raise BenchError("--spark-workers needs the embedded stack")
                    master = scale(variant.spark_workers) if variant.spark_workers else "local[*]"
                framing = (
                    replace(base, schema_registry_url=framed_url)
                    if variant.registry_framed
                    else base
                )
                runs[variant.name] = column.run(variant, framing, master, repeat, runs)
            figures = _figures(
                workload, in_flight, append_workers, runs, column.plain_reads.get(repeat)
            )
            figures["workload"]["wire"] = wire
            figures["workload"]["window_s"] = seconds
            if sustained is not None:
                figures["workload"]["sustained_in_flight"] = sustained.in_flight
                figures["workload"]["sustained_window_s"] = sustained.seconds
            figures.update(producer_rate.figures())
            figures.update(column.registry_figures)
            per_repeat.append(figures)
    finally:
        column.stop()
    figures = summarise(per_repeat)
    figures["broker_warm_up_s"] = round(warmed, 1)
    _report(figures, say)
    _chart(figures, save_figures(out, "bench", figures, say, logs).with_suffix(".png"))
    say(f"wrote {out / 'bench.png'}")
    return figures


class _Columns:
    """Runs one column of one repeat: provisions its sink, starts its system, drives the
    ticks and finishes it. Holds what the repeats share: the encoded ticks (and the registry
    column's), the upstream of the end-to-end columns, the views a bounded window ends at."""

    def __init__(
        self,
        base: Config,
        workload: Workload,
        wire: str,
        ticks: list[EncodedTick],
        final: pa.Table,
        in_flight: int,
        logs: Path,
        run_id: str,
        say: Say,
        seconds: float | None,
        keep_data: bool = False,
        stack: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        self.base, self.workload, self.wire = base, workload, wire
        self.keep_data, self.stack = keep_data, stack
        #: Sinks of the run that no column runs on (the plain read's, the warm-up's).
        self.scratch: list[Config] = []
        self.ticks, self.in_flight = ticks, in_flight
        self.logs, self.run_id, self.say, self.seconds = logs, run_id, say, seconds
        self.views = {len(ticks): final}
        self.feeder = Feeder(base.kafka_bootstrap)
        self.upstream: DataFrameFeeder | None = None
        self.registry_ticks: list[EncodedTick] | None = None
        #: What the registry column adds to the figures: its producer's rate.
        self.registry_figures: dict[str, Any] = {}
        #: The sustained window of the columns fed the encoded ticks (`drive`).
        self.sustained: Sustained | None = None
        #: Per repeat, the seconds of one plain read of the initial load (`read_load`), and
        #: the scratch sink whose desired topic holds the load for it.
        self.plain_reads: dict[int, float] = {}
        self.load_sink: Config | None = None

    def run(
        self,
        variant: Variant,
        framing: Config,
        master: str | None,
        repeat: int,
        earlier: dict[str, Run],
    ) -> Run:
        say, name = self.say, variant.name
        fed = self.ticks
        source: Feeder | DataFrameFeeder = self.feeder
        if variant.from_dataframes:
            source = self._upstream(earlier)
            fed = fed[: source.held]
        suffix = f"-r{repeat + 1}" if repeat else ""
        # provisioning registers the subjects of a registry-framed sink; the encoding below,
        # the feeder and the frontier reads frame and look up through the sink's configuration
        sink = provisioned(framing, f"{self.run_id}-{name}{suffix}", master)
        if variant.registry_framed:
            if self.registry_ticks is None:
                say(f"{name}: encoding the workload in the registry's wire format ...")
                self.registry_ticks, _, rate = encode_ticks_timed(
                    sink, self.workload, say, self.wire
                )
                self.registry_figures["producer_registry_updates_per_cpu_s"] = rate.figures()[
                    "producer_updates_per_cpu_s"
                ]
            fed = self.registry_ticks
        kinds: dict[str, type[System]] = {
            "mvsink": MvsinkSystem,
            "peer": PeerSystem,
            "delta": DeltaSystem,
            "raw": RawSystem,
        }
        system = kinds[variant.system](sink, self.logs / f"{name}{suffix}")
        system.name = name
        spark = f" (Spark {sink.spark_master})" if variant.system == "mvsink" else ""
        say(f"{name}: starting{spark} ...")
        started = time.monotonic()
        system.start()
        own = {label: proc.pid for label, proc in system.procs.items()}
        sampler = RssSampler(own)
        try:
            system.ready()
            start_s = time.monotonic() - started
            say(f"  {name}: started in {start_s:.1f}s")
            components = self.stack() if self.stack else {}
            trees = {**own, **{f"stack:{n}": pid for n, pid in components.items()}}
            result = drive(
                system,
                source,
                fed,
                self.in_flight,
                say,
                seconds=self.seconds,
                cpu=lambda: cpu_seconds(trees),
                # the end-to-end columns' upstream holds the ticks of one window
                sustained=None if variant.from_dataframes else self.sustained,
            )
            result.start_s = start_s
            result.peak_rss_mib = sampler.stop()
            system.finish(result, self._view(result.ticks))  # while it serves its metrics
        finally:
            sampler.stop()
            system.stop()
        result.spark_master = sink.spark_master if variant.system == "mvsink" else None
        say(
            f"  {name}: {result.updates_per_s:,.0f} updates/s over {result.steady_s:.1f}s "
            f"({result.steady_ticks} ticks); freshness p50 "
            f"{percentile(result.freshness, 50):.2f}s p99 {percentile(result.freshness, 99):.2f}s; "
            f"{result.detail}"
        )
        if result.sustained_s:
            say(
                f"  {name} sustained: {result.sustained_updates_per_s:,.0f} updates/s over "
                f"{result.sustained_s:.1f}s ({result.sustained_ticks} ticks, at most "
                f"{self.sustained.in_flight if self.sustained else 0} in flight); freshness p50 "
                f"{percentile(result.sustained_freshness, 50):.2f}s p99 "
                f"{percentile(result.sustained_freshness, 99):.2f}s"
            )
        self._enough_ticks(result, len(fed), variant.from_dataframes)
        self._discard(sink)
        return result

    def _enough_ticks(self, result: Run, encoded: int, from_dataframes: bool) -> None:
        """Say how many ticks to encode when `result` ran out of them before its windows
        ended."""
        if not self.seconds or result.ticks < encoded:
            return
        # (limit, ran, rate) of each window; one that never ran is taken as fast as the steady
        windows = [(self.seconds, result.steady_s, result.updates_per_s)]
        sustained = None if from_dataframes else self.sustained
        if sustained is not None:
            rate = result.sustained_updates_per_s or result.updates_per_s
            windows.append((sustained.seconds, result.sustained_s, rate))
        short = [(limit, ran) for limit, ran, _ in windows if ran < limit]
        if not short:
            return
        wanted = sum(limit * rate for limit, _, rate in windows)
        enough = math.ceil(1.2 * wanted / max(1, 2 * self.workload.changed))
        limit, ran = short[0]
        self.say(
            f"  {result.name} ran out of ticks {limit - ran:.0f}s before its {limit:g}s window "
            f"ended: --ticks {enough} gives it its whole windows"
        )

    def _discard(self, sink: Config) -> None:
        if not self.keep_data:
            topics, objects = discard(sink)
            self.say(f"  discarded {sink.sink_id}: {topics} topics, {objects:,} objects")

    def warm_up_broker(self, seconds: float) -> float:
        """Run mvsink untimed on a scratch sink for `seconds` after its initial load, or until
        the ticks run out, then discard the sink (module docs); how long it ran, its start
        included."""
        sink = provisioned(self.base, f"{self.run_id}-warm-up-broker")
        self.say(f"warming the broker up: mvsink, untimed, for up to {seconds:g}s of ticks ...")
        started = time.monotonic()
        system = MvsinkSystem(sink, self.logs / "warm-up-broker")
        system.start()
        try:
            system.ready()
            drive(system, self.feeder, self.ticks, self.in_flight, lambda _: None, seconds=seconds)
        finally:
            system.stop()
            self._discard(sink)
        ran = time.monotonic() - started
        self.say(f"  broker warmed up in {ran:.0f}s")
        return ran

    def read_load(self, repeat: int) -> None:
        """Time one plain read of the initial load (`systems.read_load`) from a scratch sink's
        desired topic, which the load is published to once: no system runs on it, so nothing
        trims it (mvsink's write service trims its own desired topic below its checkpoints)."""
        from mvsink.bench.systems import read_load

        if self.load_sink is None:
            self.load_sink = provisioned(self.base, f"{self.run_id}-load")
            self.scratch.append(self.load_sink)
            self.feeder.feed(self.load_sink, self.ticks[0])
        sink = self.load_sink
        seconds, updates = read_load(sink, sink.topics.desired, sink.partitions)
        if updates != self.ticks[0].updates:
            raise BenchError(
                f"one plain read of the initial load read {updates:,} updates, not "
                f"{self.ticks[0].updates:,} (topic {sink.topics.desired})"
            )
        self.plain_reads[repeat] = seconds
        self.say(f"one plain read of the initial load ({updates:,} updates): {seconds:.2f}s")

    def _upstream(self, earlier: dict[str, Run]) -> DataFrameFeeder:
        """The upstream job of the end-to-end columns, made (and warmed up) once. With a
        bounded window it holds the ticks mvsink alone took in 1.5 windows, when mvsink ran
        before it: fed from DataFrames, no system goes faster than mvsink alone."""
        if self.upstream is None:
            held = len(self.ticks)
            alone = earlier.get("mvsink")
            if self.seconds and alone and alone.updates_per_s:
                per_tick = max(1, 2 * self.workload.changed)
                held = min(held, 2 + math.ceil(1.5 * self.seconds * alone.updates_per_s / per_tick))
            self.upstream = DataFrameFeeder(
                self.base.kafka_bootstrap, self.workload, self.say, self.logs / "upstream", held
            )
            self.upstream.warm_up(
                lambda n: provisioned(self.base, f"{self.run_id}-warm-up-{n}"),
                self._discard,
                self.say,
            )
        return self.upstream

    def _view(self, ticks: int) -> pa.Table:
        if ticks not in self.views:
            self.views[ticks] = self.workload.view_at(ticks - 1)
        return self.views[ticks]

    def stop(self) -> None:
        if self.upstream is not None:
            self.upstream.stop()
        for sink in self.scratch:
            self._discard(sink)


def discard(sink: Config) -> tuple[int, int]:
    """Delete what a bench sink left on the stack: its definition, its own
    topics (`own_topics`) and its objects in the bucket (its shard, its write checkpoints, a
    contender's output); how many topics and objects."""
    forget(sink)
    topics = delete_topics(sink.kafka_bootstrap, own_topics(sink))
    prefixes = (f"shards/{sink.shard_id}/", f"sinks/{sink.sink_id}/", f"bench/{sink.sink_id}/")
    return len(topics), purge_objects(sink, prefixes)


def save_figures(out: Path, name: str, figures: dict[str, Any], say: Say, logs: Path) -> Path:
    """Write `figures` to `out/<name>.json` (creating `out`); the path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(figures, indent=2) + "\n")
    say(f"wrote {path} (logs in {logs})")
    return path


def _figures(
    workload: Workload,
    in_flight: int,
    append_workers: int,
    runs: dict[str, Run],
    plain_read_s: float | None = None,
) -> dict[str, Any]:
    def rate(name: str) -> float | None:
        return round(runs[name].updates_per_s, 1) if name in runs else None

    mv, peer, raw = rate("mvsink"), rate("peer"), rate("raw")
    figures: dict[str, Any] = {
        "mvsink_updates_per_s": mv,
        "peer_updates_per_s": peer,
        "raw_updates_per_s": raw,
        "ratio_vs_peer": round(mv / peer, 3) if mv and peer else None,
        "ratio_vs_delta": round(mv / delta, 3) if mv and (delta := rate("delta")) else None,
        "ratio_vs_raw": round(mv / raw, 3) if mv and raw else None,
        "ratio_e2e_vs_peer_e2e": (
            round(e2e / peer_e2e, 3)
            if (e2e := rate("mvsink-e2e")) and (peer_e2e := rate("peer-e2e"))
            else None
        ),
        "ratio_e2e_vs_alone": (round(e2e / mv, 3) if mv and (e2e := rate("mvsink-e2e")) else None),
        "ratio_registry_vs_own_framing": (
            round(framed / mv, 3) if mv and (framed := rate(REGISTRY_FRAMED)) else None
        ),
        "freshness_p50_s": None,
        "freshness_p99_s": None,
    }
    figures["systems"] = list(runs)
    for name, result in runs.items():
        figures[f"{name}_updates_per_s"] = rate(name)
        if result.spark_master:
            figures[f"{name}_spark_master"] = result.spark_master
        if name != "mvsink" and result.correct is not None:
            figures[f"{name}_shard_equals_desired"] = result.correct
        prefix = "" if name == "mvsink" else f"{name}_"
        figures[f"{prefix}freshness_p50_s"] = round(percentile(result.freshness, 50), 3)
        figures[f"{prefix}freshness_p99_s"] = round(percentile(result.freshness, 99), 3)
        figures[f"{name}_start_s"] = round(result.start_s, 2)
        figures[f"{name}_initial_load_s"] = round(result.initial_load_s, 2)
        figures[f"{name}_load_publish_s"] = round(result.load_publish_s, 2)
        if plain_read_s:
            figures[f"{name}_hydration_vs_plain_read"] = round(
                result.initial_load_s / plain_read_s, 2
            )
        figures[f"{name}_steady_s"] = round(result.steady_s, 2)
        figures[f"{name}_steady_ticks"] = result.steady_ticks
        if result.sustained_s:
            figures[f"{name}_sustained_updates_per_s"] = round(result.sustained_updates_per_s, 1)
            figures[f"{name}_sustained_s"] = round(result.sustained_s, 2)
            figures[f"{name}_sustained_ticks"] = result.sustained_ticks
            for q in (50, 99):
                figures[f"{name}_sustained_freshness_p{q}_s"] = round(
                    percentile(result.sustained_freshness, q), 3
                )
            if result.sustained_cpu_cores:
                figures[f"{name}_sustained_cpu_cores"] = result.sustained_cpu_cores
                figures[f"{name}_sustained_cpu_cores_total"] = round(
                    sum(result.sustained_cpu_cores.values()), 3
                )
        figures[f"{name}_peak_rss_mib"] = result.peak_rss_mib
        if result.cpu_cores:
            cores = sum(result.cpu_cores.values())
            figures[f"{name}_cpu_cores"] = result.cpu_cores
            figures[f"{name}_cpu_cores_total"] = round(cores, 3)
            figures[f"{name}_updates_per_cpu_s"] = (
                round(result.updates_per_s / cores) if cores else None
            )
        if result.table_bytes is not None:
            figures[f"{name}_table_bytes"] = result.table_bytes
        if result.cycle:
            figures[f"{name}_cycle_s"] = result.cycle
        figures[f"{name}_bytes_read_back_per_byte_written"] = (
            round(result.bytes_read_back / result.bytes_written, 4) if result.bytes_written else 0.0
        )
        if result.batch_seconds:
            figures[f"{name}_batch_latency_p50_s"] = round(percentile(result.batch_seconds, 50), 3)
            figures[f"{name}_batch_latency_p99_s"] = round(percentile(result.batch_seconds, 99), 3)
    sustained = {
        name: round(result.sustained_updates_per_s, 1)
        for name, result in runs.items()
        if result.sustained_s
    }
    if "mvsink" in sustained:
        for other in ("peer", "delta", "raw"):
            if other in sustained:
                figures[f"ratio_sustained_vs_{other}"] = round(
                    sustained["mvsink"] / sustained[other], 3
                )
    mv_cpu, raw_cpu = figures.get("mvsink_updates_per_cpu_s"), figures.get("raw_updates_per_cpu_s")
    figures["ratio_vs_raw_per_cpu_s"] = round(mv_cpu / raw_cpu, 3) if mv_cpu and raw_cpu else None
    if plain_read_s:
        figures["plain_read_load_s"] = round(plain_read_s, 3)
    if "mvsink" in runs:
        figures["mvsink_bytes_written"] = runs["mvsink"].bytes_written
        figures["mvsink_bytes_read_back"] = runs["mvsink"].bytes_read_back
        figures["mvsink_shard_equals_desired"] = runs["mvsink"].correct
    figures["workload"] = {
        "keys": workload.keys,
        "change": workload.change,
        "ticks": workload.ticks,
        "updates_per_tick": 2 * workload.changed,
        "partitions": workload.partitions,
        "append_workers": append_workers,
        "in_flight": in_flight,
        "cores": os.cpu_count(),
    }
    return figures


def _report(figures: dict[str, Any], say: Say) -> None:
    """The table: each cell the median over the repeats with its [min-max] (`repeats.cell`)."""
    count = len(figures.get("repeats", ())) or 1
    names = figures.get("systems") or [n for n in SYSTEMS if f"{n}_peak_rss_mib" in figures]
    say("")
    if count > 1:
        say(f"{count} repeats, interleaved: every cell is the median [min-max] over them")
    width = 24 if count > 1 else 16
    say(f"{'':<34} " + " ".join(f"{HEADINGS.get(n, n):>{width}}" for n in names))
    rows = [
        ("updates/s (steady ticks)", "{}updates_per_s", ""),
        ("steady window", "{}steady_s", " s"),
        ("freshness p50", "{}freshness_p50_s", " s"),
        ("freshness p99", "{}freshness_p99_s", " s"),
        ("micro-batch latency p50", "{}batch_latency_p50_s", " s"),
        ("micro-batch latency p99", "{}batch_latency_p99_s", " s"),
        ("process start", "{}start_s", " s"),
        ("initial load (hydration)", "{}initial_load_s", " s"),
        ("  of which publishing it", "{}load_publish_s", " s"),
        ("hydration / one plain read", "{}hydration_vs_plain_read", ""),
        ("bytes read back / byte written", "{}bytes_read_back_per_byte_written", ""),
        ("CPU cores (steady window)", "{}cpu_cores_total", ""),
        ("sustained updates/s", "{}sustained_updates_per_s", ""),
        ("sustained window", "{}sustained_s", " s"),
        ("sustained freshness p50", "{}sustained_freshness_p50_s", " s"),
        ("sustained freshness p99", "{}sustained_freshness_p99_s", " s"),
        ("CPU cores (sustained window)", "{}sustained_cpu_cores_total", ""),
        ("updates per CPU second", "{}updates_per_cpu_s", ""),
        ("table in the bucket (MiB)", "{}table_mib", ""),
    ]
    for name in names:  # shown in MiB
        if f"{name}_table_bytes" in figures:
            mib = {f"{name}_table_mib": figures[f"{name}_table_bytes"] / 2**20}
            low_high = figures.get("spread", {}).get(f"{name}_table_bytes")
            spread = {**figures.get("spread", {})}
            if low_high:
                spread[f"{name}_table_mib"] = [v / 2**20 for v in low_high]
            figures = {**figures, **mib, "spread": spread}
    for label, key, unit in rows:
        cells = []
        for name in names:
            k = key.format(f"{name}_")
            if name == "mvsink" and k not in figures:
                k = key.format("")
            cells.append(cell(figures, k, unit))
        if any(c != "-" for c in cells):
            say(f"{label:<34} " + " ".join(f"{c:>{width}}" for c in cells))
    if figures.get("plain_read_load_s") is not None:
        say(
            f"one plain read of the initial load (consumed and decoded, nothing written): "
            f"{cell(figures, 'plain_read_load_s', ' s')}"
        )
    # Per million keys only where the view outweighs the processes' fixed cost (a JVM, Python).
    millions = figures["workload"]["keys"] / 1e6
    for name in names:
        rss = figures.get(f"{name}_peak_rss_mib")
        if rss:
            shown = " ".join(f"{k}={v:,.0f}" for k, v in rss.items())
            per = f"; {sum(rss.values()) / millions:,.0f} per million keys" if millions >= 1 else ""
            say(f"peak RSS {name:<25} {shown} MiB (largest over the repeats{per})")
    for name in names:
        cores = figures.get(f"{name}_cpu_cores")
        if cores:
            shown = " ".join(f"{k}={v:.2f}" for k, v in cores.items())
            say(f"CPU cores {name:<24} {shown} (medians, steady window)")
    for name in names:
        cores = figures.get(f"{name}_sustained_cpu_cores")
        if cores:
            shown = " ".join(f"{k}={v:.2f}" for k, v in cores.items())
            say(f"CPU cores {name + ' sustained':<24} {shown} (medians, sustained window)")
    for name in names:
        cycle = figures.get(f"{name}_cycle_s")
        if cycle and "cycle" in cycle:
            say(f"cycle {name:<28} {describe(cycle)} (medians over the steady descriptions)")
    if figures.get("ratio_vs_raw_per_cpu_s") is not None:
        say(
            f"updates per CPU second mvsink/raw {cell(figures, 'ratio_vs_raw_per_cpu_s')} (the "
            f"systems' processes and the stack's; not the bench's feeder) on "
            f"{figures['workload']['cores']} cores"
        )
    say(
        f"ratio mvsink/peer {cell(figures, 'ratio_vs_peer')}   ratio mvsink/raw "
        f"{cell(figures, 'ratio_vs_raw')}   shard equals desired: "
        f"{figures.get('mvsink_shard_equals_desired')}"
    )
    if figures.get("ratio_sustained_vs_raw") is not None:
        depth = figures["workload"].get("sustained_in_flight")
        ratios = [
            f"ratio mvsink/{HEADINGS[other] if other == 'delta' else other} "
            f"{cell(figures, f'ratio_sustained_vs_{other}')}"
            for other in ("peer", "delta", "raw")
            if figures.get(f"ratio_sustained_vs_{other}") is not None
        ]
        say(f"sustained (at most {depth} ticks in flight): " + "   ".join(ratios))
    if figures.get("ratio_vs_delta") is not None:
        say(
            f"ratio mvsink/Delta MERGE {cell(figures, 'ratio_vs_delta')}   Delta table equals the "
            f"view: {figures.get('delta_shard_equals_desired')}"
        )
    if figures.get("ratio_e2e_vs_peer_e2e") is not None:
        say(
            f"end to end (upstream DataFrame -> durable): ratio mvsink/peer "
            f"{cell(figures, 'ratio_e2e_vs_peer_e2e')}; mvsink end to end / mvsink alone "
            f"{cell(figures, 'ratio_e2e_vs_alone')}"
        )
    if figures.get("ratio_registry_vs_own_framing") is not None:
        say(
            f"Schema Registry wire format: ratio mvsink (registry)/mvsink "
            f"{cell(figures, 'ratio_registry_vs_own_framing')}; producer "
            f"{cell(figures, 'producer_registry_updates_per_cpu_s')} updates per CPU second "
            f"(own framing {cell(figures, 'producer_updates_per_cpu_s')})"
        )
    if "producer_updates_per_cpu_s" in figures:
        say(
            f"producer (partitioning {figures['producer_partitioning']}): "
            f"{cell(figures, 'producer_updates_per_cpu_s')} updates per CPU second, "
            f"partitioning 1: {cell(figures, 'producer_v1_updates_per_cpu_s')}"
        )


def _chart(figures: dict[str, Any], path: Path) -> None:
    """Bars at the medians; each bar's whisker spans its min-max over the repeats."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spread = figures.get("spread", {})

    def whiskers(keys: list[str]) -> np.ndarray:
        low, high = [], []
        for key in keys:
            value = figures.get(key) or 0
            low_high = spread.get(key, [value, value])
            low.append(max(0.0, value - low_high[0]))
            high.append(max(0.0, low_high[1] - value))
        return np.array([low, high])

    names = [
        n for n in figures.get("systems", SYSTEMS) if figures.get(f"{n}_updates_per_s") is not None
    ]
    fig, (rate, fresh, rss) = plt.subplots(1, 3, figsize=(4 + 2.7 * len(names), 3.6))
    width = 0.38
    xs = np.arange(len(names))
    keys = [f"{n}_updates_per_s" for n in names]
    deeper = [f"{n}_sustained_updates_per_s" for n in names]
    workload = figures["workload"]
    if any(figures.get(k) for k in deeper):
        steady = f"steady (in flight {workload['in_flight']})"
        sustained = f"sustained (in flight {workload.get('sustained_in_flight')})"
        for offset, group, label in ((-width / 2, keys, steady), (width / 2, deeper, sustained)):
            values = [figures.get(k) or 0 for k in group]
            rate.bar(xs + offset, values, width, yerr=whiskers(group), capsize=3, label=label)
        rate.legend()
    else:
        rate.bar(xs, [figures[k] for k in keys], yerr=whiskers(keys), capsize=4, color="#3b6")
    rate.set_xticks(xs, names)
    rate.set_title("updates/s")
    for offset, q in ((-width / 2, "p50"), (width / 2, "p99")):
        keys = [f"freshness_{q}_s" if n == "mvsink" else f"{n}_freshness_{q}_s" for n in names]
        values = [figures.get(k) or 0 for k in keys]
        fresh.bar(xs + offset, values, width, yerr=whiskers(keys), capsize=3, label=q)
    fresh.set_xticks(xs, names)
    fresh.set_title("freshness: tick published -> durable (s)")
    fresh.legend()
    rss.bar(names, [sum(figures[f"{n}_peak_rss_mib"].values()) for n in names], color="#c96")
    rss.set_title("peak RSS, all processes (MiB)")
    count = len(figures.get("repeats", ())) or 1
    fig.suptitle(
        f"mvsink bench: {workload['keys']:,} keys, {workload['updates_per_tick']:,} updates/tick, "
        f"P={workload['partitions']}, A={workload['append_workers']}, {workload['cores']} cores"
        + (f"; median and min-max of {count} repeats" if count > 1 else "")
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
