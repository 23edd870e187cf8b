"""`mvsink bench soak`: the pipeline for many ticks, to show the shard stays small and fast.

System and workload: the workload of `mvsink bench` at soak size (default 10k keys, 10 % of them
changing per tick: a retraction and an insertion each), fed closed loop (2 ticks in flight) to
mint + write + append, compaction on, with short deletion bounds so garbage goes within seconds
and the bucket shows what is kept: replaced parts deleted 1 s after their merge, versions pruned
12 s after they were superseded (requests time out after 5 s, so 12 s is safe), never-referenced
parts swept after 30 s, no retained history (`retain_history = 0`).

Baseline: the same run early on. Each figure is taken over two windows of `window` ticks, one
ending at the early tick (`--early`, ~100) and the last one, and printed side by side with their
ratio and targets (met or missed, never asserted):

* state version bytes, live batches and parts (`Shard.state()`), and the bucket: parts under the
  shard's prefix (live, and replaced ones not collected yet) plus metadata (retained state
  versions and the write checkpoints) -- sampled about every second by a thread, medians over
  the samples whose last durable tick is in the window (none are taken during restarts; a
  window a fast pipeline passed between two samples is topped up to a few when its drive ends);
* compare-and-append p50/p99 of the window's appends (the append service logs each latency);
* snapshot time (`Shard.snapshot` at the upper, at each sample), median over the window;
* state versions the shard's log retains (at each sample), median over the window;
* S3 requests per hour of the writing replica (mint, write with its Spark executors, append)
  and of a read-only standby beside it (the same services with `read_only`, a sink of their own
  on the same shard, fed every tick the writer is), over the window (from its first tick
  published to its last one durable): each replica reaches the store through a counting proxy
  in a process of its own (`mvsink.bench.s3proxy`; `soak.json` has the run's requests by
  replica, method and kind), the sampler directly. The standby's checkpoints are not in the
  bucket figures, and the restarts stop the writing replica's write service only;
* freshness p50/p99 of the window's ticks: published -> the shard's upper past them;
* the desired topic, at the window's last tick: its bytes on the broker (the partitions'
  segments, Kafka's DescribeLogDirs) and the records it retains (end - log start). The write
  service deletes what its checkpoints are past every 2 s here, and segments roll every second;
* two restarts right after each window, each against one read of every live part
  (`steady.read_once`, the median of 3 reads), each followed by one tick published and timed
  by its first staging job (its log): a *cold restart* (the write service alone stopped and
  started again, its checkpoints kept) and a *repair restart* (stopped, its checkpoints deleted,
  `mvsink repair` re-seeding them from the shard -- desired no longer starts at offset 0 -- then
  started). The ticks published are empty ones at the end; early on they are the workload's
  next ticks (whose times are fixed: an empty tick would take them), so the early jobs also
  stage one tick of updates.

Targets: each figure within x1.5 of its early value (flat); live parts <= 64 P; bucket bytes
<= 3x the consolidated view (no retained history term: `retain_history` is 0), the view being
the live parts' bytes after a forced full merge at the end; cold restart <= 2x one read. The
shard must equal the view at the end (`MvsinkSystem.finish`, before and after the last restarts)
and every figure of the table must have been measured. `soak.json` holds the figures and the
timeline of samples, `soak.png` charts the timeline.
"""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from mvsink import Say
from mvsink.bench.compare import drive, percentile, save_figures, sink_config
from mvsink.bench.contenders import MvsinkSystem, Run
from mvsink.bench.cycle import APPENDED
from mvsink.bench.s3proxy import ProxyProcess
from mvsink.bench.steady import empty_tick, first_job, read_once, wait_upper
from mvsink.bench.workload import BenchError, EncodedTick, Feeder, Workload, encode_ticks
from mvsink.io.config import Config, cache_dir, state_dir
from mvsink.io.kafka import watermarks
from mvsink.io.s3 import s3_client
from mvsink.shard import Shard, open_shard
from mvsink.shard.compact import compact_once
from mvsink.stack.kafka import ensure_libs, topic_bytes
from mvsink.tools.demo import service_env, start_service, stop_services
from mvsink.tools.provision import provision

#: The sink's shard timing: garbage goes within seconds, so bucket bytes show what is kept.
SOAK_SHARD = {
    "shard_max_attempt_age": 5.0,
    "shard_request_timeout": 5.0,
    "shard_max_part_age": 20.0,
    "shard_min_grace": 30.0,
    "shard_part_grace": 1.0,
    "shard_version_grace": 12.0,
    "retain_history": 0,
    "desired_trim_interval": 2.0,
    "desired_segment_ms": 1000,
}
#: Targets: flat (end within this factor of early), live parts per desired partition, bucket
#: bytes per byte of the consolidated view, cold restart per read of the shard.
FLAT, PARTS_PER_PARTITION, VIEW_FACTOR, RESTART_FACTOR = 1.5, 64, 3.0, 2.0
#: Reads of the shard per cold restart baseline (their median is "one read").
READS = 3
#: Samples each window has at least: a drive ending at a window's last tick tops it up.
WINDOW_SAMPLES = 3
#: The figures of the table: key, label, unit.
FIGURES = (
    ("state_bytes", "state version", "B"),
    ("live_batches", "live batches", ""),
    ("live_parts", "live parts", ""),
    ("part_bytes", "parts in the bucket", "B"),
    ("metadata_bytes", "metadata in the bucket", "B"),
    ("bucket_bytes", "bucket bytes", "B"),
    ("cas_p50_ms", "compare-and-append p50", "ms"),
    ("cas_p99_ms", "compare-and-append p99", "ms"),
    ("snapshot_s", "snapshot at the upper", "s"),
    ("freshness_p50_s", "freshness p50", "s"),
    ("freshness_p99_s", "freshness p99", "s"),
    ("retained_versions", "state versions retained", ""),
    ("s3_requests_per_hour", "S3 requests/h, writing", ""),
    ("standby_s3_requests_per_hour", "S3 requests/h, standby", ""),
    ("desired_bytes", "desired on the broker", "B"),
    ("desired_records", "desired records kept", ""),
    ("cold_restart_s", "cold restart: first job", "s"),
    ("repair_restart_s", "repair restart: first job", "s"),
    ("read_once_s", "one read of the shard", "s"),
    ("cold_restart_vs_read_once", "cold restart / one read", "x"),
    ("repair_restart_vs_read_once", "repair restart / one read", "x"),
)


@dataclass(frozen=True)
class Sample:
    """The shard as the sampler saw it, `t_s` seconds into the run."""

    t_s: float
    upper: int
    state_bytes: int
    live_batches: int
    live_parts: int
    live_bytes: int
    #: Every part in the bucket under the shard: live, and replaced ones not yet collected.
    part_bytes: int
    #: Everything else the sink keeps: retained state versions and the write checkpoints.
    metadata_bytes: int
    snapshot_s: float | None
    #: State versions the shard's log holds (`Shard.retained_seqnos`).
    retained: int = 0

    @property
    def tick(self) -> int:
        """The last durable tick (-1 before the initial load)."""
        return self.upper - 1

    @property
    def bucket_bytes(self) -> int:
        """Everything the sink keeps in the bucket."""
        return self.part_bytes + self.metadata_bytes

    def to_json(self) -> dict[str, Any]:
        """The timeline entry of `soak.json`."""
        return {"tick": self.tick, **asdict(self), "bucket_bytes": self.bucket_bytes}


class Sampler:
    """Samples the shard every `interval` seconds on its own thread (its own shard handle)
    while resumed; `pause` returns once no sample is in progress."""

    def __init__(
        self, config: Config, say: Say, interval: float = 1.0, progress_every: int = 50
    ) -> None:
        self.config, self.say, self.interval = config, say, interval
        self.progress_every, self._next_progress = progress_every, progress_every
        self.shard = open_shard(config.shard_id, None, config.s3)
        self.client = s3_client(config.s3)
        self.samples: list[Sample] = []
        #: Samples that failed (e.g. a version pruned between LIST and GET); the next one runs.
        self.errors = 0
        self._lock = threading.Lock()
        self._running = False
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def start(self) -> None:
        self._running = True
        self._thread.start()

    def pause(self) -> None:
        with self._lock:
            self._running = False

    def resume(self) -> None:
        with self._lock:
            self._running = True

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                if not self._running or (sample := self._take()) is None:
                    continue
            if sample.tick >= self._next_progress:
                self._next_progress = sample.tick + self.progress_every
                self.say(
                    f"  tick {sample.tick} (upper {{{sample.upper}}}): {sample.live_batches} live batches, "
                    f"{sample.live_parts} live parts, bucket {sample.bucket_bytes / 2**20:.2f} MiB "
                    f"(parts {sample.part_bytes / 2**20:.2f}, metadata {sample.metadata_bytes / 2**20:.2f}), "
                    f"state version {sample.state_bytes:,} B"
                )

    def fill(self, window: tuple[int, int], count: int) -> None:
        """Sample now until `count` samples fall in `window` (a few tries at most). A fast
        pipeline can pass a short window between two timed samples; called when a drive ends
        at the window's last tick, which holds while nothing more is published."""
        low, high = window
        for _ in range(3 * count):
            with self._lock:
                if sum(low <= s.tick <= high for s in self.samples) >= count:
                    return
                self._take()

    def _take(self) -> Sample | None:
        """One sample, kept; `None` if it failed (e.g. a version pruned between LIST and GET:
        the next one is fine, the count goes into the figures)."""
        try:
            sample = self.sample()
        except Exception:
            self.errors += 1
            return None
        self.samples.append(sample)
        return sample

    def sample(self) -> Sample:
        """Read the latest state, time a snapshot at its upper, and LIST the sink's objects."""
        at = round(time.monotonic() - self._started, 2)
        state = self.shard.state()
        upper = state.upper.time or 0
        snapshot_s = None
        if upper:
            started = time.monotonic()
            self.shard.snapshot(upper)
            snapshot_s = time.monotonic() - started
        parts = metadata = 0
        prefix, bucket = f"{self.shard.prefix}/", self.config.s3.bucket
        for obj in self.client.list_objects(bucket, prefix=prefix, recursive=True):
            if obj.object_name.startswith(f"{prefix}parts/"):
                parts += obj.size or 0
            else:
                metadata += obj.size or 0
        for obj in self.client.list_objects(
            bucket, prefix=_checkpoints(self.config), recursive=True
        ):
            metadata += obj.size or 0
        return Sample(
            at,
            upper,
            len(state.to_bytes()),
            len(state.batches),
            len(state.part_keys),
            state.total_bytes(),
            parts,
            metadata,
            snapshot_s,
            len(self.shard.retained_seqnos()),
        )


def _checkpoints(config: Config) -> str:
    """Prefix of the write service's checkpoints of the sink of `config`."""
    return f"sinks/{config.sink_id}/write/"


def run_soak(
    config: Config, workload: Workload, early: int, window: int, out: Path, say: Say
) -> dict[str, Any]:
    """The soak benchmark (module docs); the figures, also in `out/soak.json` and `out/soak.png`.

    `early` is clamped to `[window + 1, ticks // 2]`.

    Raises:
        BenchError: too few ticks for two disjoint windows, or the pipeline stopped making
            progress.
    """
    if window < 1:
        raise BenchError(f"soak needs --window >= 1, got {window}")
    early = max(window + 1, min(early, workload.ticks // 2))
    if workload.ticks < early + window + 3:
        raise BenchError(f"soak with --window {window} needs --ticks >= {2 * window + 4}")
    run_id = f"soak-{uuid.uuid4().hex[:6]}"
    sink = sink_config(config, run_id, workload.partitions, **SOAK_SHARD)
    beside = sink_config(
        config,
        f"{run_id}-ro",
        workload.partitions,
        shard_id=sink.shard_id,
        read_only=True,
        **SOAK_SHARD,
    )
    for each in (sink, beside):
        provision(each)
    say(f"encoding {workload.ticks + 1} ticks (untimed) ...")
    ticks, final = encode_ticks(sink, workload, say)
    logs = state_dir() / "bench" / run_id
    # Each replica reaches the store through its own counting proxy (the sampler does not).
    proxy, standby_proxy = (ProxyProcess(sink.s3.endpoint).__enter__() for _ in range(2))
    system, standby = (
        MvsinkSystem(replace(c, s3=replace(c.s3, endpoint=p.endpoint)), path)
        for c, p, path in ((sink, proxy, logs), (beside, standby_proxy, logs / "standby"))
    )
    feeder, sampler = Tee(config.kafka_bootstrap, standby), Sampler(sink, say)
    shard = open_shard(sink.shard_id, None, sink.s3)
    windows = {
        "early": (early - window + 1, early),
        "end": (workload.ticks - window + 1, workload.ticks),
    }
    say(
        f"soak {run_id}: {workload.ticks} ticks; windows ticks {windows['early']} and {windows['end']}"
    )
    system.start()
    standby.start()
    sampler.start()
    checked, rechecked = Run("mvsink"), Run("mvsink")
    try:
        first = _drive(system, feeder, ticks[: early + 1], say, "early part")
        rates = {"early": _requests((proxy, standby_proxy), first, window)}
        sampler.fill(windows["early"], WINDOW_SAMPLES)
        sampler.pause()  # the pipeline idles now: samples would show its compacted state
        desired_early = _desired_size(sink, say)
        restart_early = _restarts(system, feeder, shard, ticks[early + 1 : early + 3], say)
        sampler.resume()
        rest = _drive(system, feeder, ticks[early + 3 :], say, "long part")
        rates["end"] = _requests((proxy, standby_proxy), rest, window)
        sampler.fill(windows["end"], WINDOW_SAMPLES)
        sampler.pause()  # the pipeline idles now: samples would show its compacted state
        desired_end = _desired_size(sink, say)
        system.finish(checked, final)  # while the services serve their metrics
        ends = [empty_tick(workload.ticks + 1), empty_tick(workload.ticks + 2)]
        restart_end = _restarts(system, feeder, shard, ends, say)
        system.finish(rechecked, final)
        requests = {"writing": proxy.snapshot(), "standby": standby_proxy.snapshot()}
    finally:
        sampler.stop()
        for replica in (system, standby):
            replica.stop()
        for counting in (proxy, standby_proxy):
            counting.__exit__(None, None, None)
    view = _consolidated_view(sink, shard)
    figures = _figures(
        sampler.samples,
        windows,
        logs / "append.log",
        {"early": first.freshness[-window:], "end": rest.freshness[-window:]},
        {
            "early": {**restart_early, **desired_early, **rates["early"]},
            "end": {**restart_end, **desired_end, **rates["end"]},
        },
    )
    figures.update(
        view_bytes=view["bytes"],
        view_updates=view["updates"],
        view=view,
        correct=checked.correct is True and rechecked.correct is True,
        correct_before_restart=checked.correct,
        correct_after_restart=rechecked.correct,
        sampler_errors=sampler.errors,
        s3_requests=requests,
        shard_timing=SOAK_SHARD,
        workload={
            "keys": workload.keys,
            "change": workload.change,
            "ticks": workload.ticks,
            "partitions": workload.partitions,
            "early": early,
            "window": window,
            "updates_per_tick": 2 * workload.changed,
        },
    )
    figures["targets"] = _targets(figures, workload.partitions)
    figures["not_measured"] = _not_measured(figures)
    figures["measured"] = not figures["not_measured"]
    figures["timeline"] = [s.to_json() for s in sampler.samples]
    _report(figures, say)
    _chart(figures, save_figures(out, "soak", figures, say, logs).with_suffix(".png"))
    say(f"wrote {out / 'soak.png'}")
    return figures


class Tee(Feeder):
    """Feeds each tick to the standby's sink too, before the writer's (whose ends it returns),
    and checks that the standby's services still run."""

    def __init__(self, bootstrap: str, standby: MvsinkSystem) -> None:
        super().__init__(bootstrap)
        self.standby = standby

    def feed(self, config: Config, tick: EncodedTick) -> dict[int, int]:
        self.standby.ends[tick.time] = super().feed(self.standby.config, tick)
        self.standby.check_alive()
        return super().feed(config, tick)


def _requests(
    proxies: tuple[ProxyProcess, ProxyProcess], run: Run, window: int
) -> dict[str, float]:
    """The writing replica's and the standby's S3 requests per hour over a drive's last
    `window` ticks: from the first one published to the last one durable."""
    since, until = run.tick_times[-window][0], run.tick_times[-1][1]
    rates = [proxy.per_hour(since, until) for proxy in proxies]
    return {
        key: math.nan if rate is None else rate
        for key, rate in zip(
            ("s3_requests_per_hour", "standby_s3_requests_per_hour"), rates, strict=True
        )
    }


def _drive(
    system: MvsinkSystem, feeder: Feeder, ticks: list[EncodedTick], say: Say, what: str
) -> Run:
    run = drive(system, feeder, ticks, 2, say)
    say(
        f"  {what}: {len(ticks)} ticks to upper {{{system.upper}}}, {run.updates_per_s:,.0f} updates/s"
    )
    return run


def _desired_size(config: Config, say: Say) -> dict[str, float]:
    """The desired topic's bytes on the broker and the records it keeps, summed over its
    partitions."""
    libs = ensure_libs(cache_dir(), say)
    topic = config.topics.desired
    sizes = topic_bytes(libs, config.kafka_bootstrap, topic)
    marks = watermarks(config.kafka_bootstrap, topic, range(config.partitions))
    records = sum(high - low for low, high in marks.values())
    say(
        f"  {topic}: {sum(sizes.values()) / 2**20:.2f} MiB on the broker, {records:,} records kept "
        f"(log starts {[low for low, _ in marks.values()]})"
    )
    return {"desired_bytes": float(sum(sizes.values())), "desired_records": float(records)}


def _restarts(
    system: MvsinkSystem, feeder: Feeder, shard: Shard, ticks: list[EncodedTick], say: Say
) -> dict[str, float]:
    """One read of the shard, then a cold restart of the write service publishing `ticks[0]`
    and a repair restart publishing `ticks[1]` (module docs): their first staging jobs' seconds
    (nan if none was logged) and ratios to the read."""
    stop_services([system.procs["write"]])
    # No writer, no compactor: the shard holds still. The median of a few reads, as one read of
    # a small shard is short and noisy.
    reads = [read_once(shard) for _ in range(READS)]
    baseline = {**reads[0], "seconds": statistics.median(r["seconds"] for r in reads)}
    figures = {"read_once_s": baseline["seconds"]}
    for case, tick in zip(("cold_restart", "repair_restart"), ticks, strict=True):
        if case == "repair_restart":
            stop_services([system.procs["write"]])
            _repair(system.config, say)
        seconds = _restart(system, feeder, tick)
        ratio = seconds / baseline["seconds"]
        say(
            f"  {case.replace('_', ' ')} at tick {tick.time}: first job {seconds:.2f}s, one read "
            f"of the shard {baseline['seconds']:.3f}s ({baseline['parts']:.0f} parts, "
            f"{baseline['bytes'] / 2**10:,.0f} KiB): x{ratio:.1f}"
        )
        figures |= {f"{case}_s": seconds, f"{case}_vs_read_once": ratio}
    return figures


def _restart(system: MvsinkSystem, feeder: Feeder, tick: EncodedTick) -> float:
    """Start the (stopped) write service and publish `tick`: its first staging job's seconds."""
    config, log = system.config, system.logs / "write.log"
    offset = log.stat().st_size
    system.procs["write"] = start_service(config, "write", system.logs)
    system.ends[tick.time] = feeder.feed(config, tick)
    wait_upper(system, tick.time + 1, "a restart of the write service")
    return first_job(log, offset)[0]


def _repair(config: Config, say: Say) -> None:
    """Delete the write service's checkpoints and re-seed every partition's from the shard, as
    `mvsink repair <sink> --yes` does (desired no longer starts at offset 0)."""
    client = s3_client(config.s3)
    for item in client.list_objects(config.s3.bucket, prefix=_checkpoints(config), recursive=True):
        client.remove_object(config.s3.bucket, item.object_name)
    started = time.monotonic()
    partitions = [f"--partition={p}" for p in range(config.partitions)]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.write.repair",
            "repair",
            config.sink_id,
            *partitions,
            "--yes",
            "--writer-id=soak-repair",
        ],
        env=service_env(config),
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise BenchError(f"the repair failed: {done.stderr.strip()}")
    say(f"  checkpoints deleted and repaired from the shard in {time.monotonic() - started:.2f}s")


def _consolidated_view(sink: Config, shard: Shard, attempts: int = 5) -> dict[str, int | None]:
    """Bytes, updates and parts of the live batches after a forced full merge. The services are
    stopped and the write service released its lease, so `since` is the upper and the merge
    collapses all history: what is left is the view."""
    for _ in range(attempts):
        if compact_once(shard, sink.compaction_policy(), "soak", force=True) is None:
            break
        if len(shard.state().batches) <= 1:
            break
    state = shard.state()
    return {
        "bytes": state.total_bytes(),
        "updates": state.total_updates(),
        "parts": len(state.part_keys),
        "batches": len(state.batches),
        "since": state.since.time,
        "upper": state.upper.time,
    }


def _figures(
    samples: list[Sample],
    windows: dict[str, tuple[int, int]],
    append_log: Path,
    freshness: dict[str, list[float]],
    restarts: dict[str, dict[str, float]],
) -> dict[str, Any]:
    """Per window: the medians of its samples, its appends' latencies, its ticks' freshness and
    the cold restart after it (`None`: nothing measured)."""
    appends = [
        (int(m["upper"]), float(m["took_ms"]))
        for m in APPENDED.finditer(append_log.read_text(errors="replace"))
    ]
    out: dict[str, Any] = {}
    for name, (low, high) in windows.items():
        chosen = [s for s in samples if low <= s.tick <= high]
        latencies = [ms for upper, ms in appends if low < upper <= high + 1]
        out[name] = {
            "ticks": [low, high],
            "samples": len(chosen),
            "appends": len(latencies),
            "state_bytes": _median([s.state_bytes for s in chosen]),
            "live_batches": _median([s.live_batches for s in chosen]),
            "live_batches_max": max((s.live_batches for s in chosen), default=None),
            "live_parts": _median([s.live_parts for s in chosen]),
            "live_parts_max": max((s.live_parts for s in chosen), default=None),
            "live_bytes": _median([s.live_bytes for s in chosen]),
            "part_bytes": _median([s.part_bytes for s in chosen]),
            "part_bytes_max": max((s.part_bytes for s in chosen), default=None),
            "metadata_bytes": _median([s.metadata_bytes for s in chosen]),
            "bucket_bytes": _median([s.bucket_bytes for s in chosen]),
            "bucket_bytes_max": max((s.bucket_bytes for s in chosen), default=None),
            "cas_p50_ms": _finite(percentile(latencies, 50)),
            "cas_p99_ms": _finite(percentile(latencies, 99)),
            "snapshot_s": _median([s.snapshot_s for s in chosen if s.snapshot_s is not None]),
            "retained_versions": _median([s.retained for s in chosen]),
            "freshness_p50_s": _finite(percentile(freshness[name], 50)),
            "freshness_p99_s": _finite(percentile(freshness[name], 99)),
            **{
                key: _finite(restarts[name][key])
                for key in (
                    "s3_requests_per_hour",
                    "standby_s3_requests_per_hour",
                    "desired_bytes",
                    "desired_records",
                    "cold_restart_s",
                    "repair_restart_s",
                    "read_once_s",
                    "cold_restart_vs_read_once",
                    "repair_restart_vs_read_once",
                )
            },
        }
    return out


def _median(values: list[float] | list[int]) -> float | None:
    return float(statistics.median(values)) if values else None


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _targets(figures: dict[str, Any], partitions: int) -> list[dict[str, Any]]:
    """Every target with the measured value, its limit and whether it was met (`None`: the
    value was not measured)."""
    early, end = figures["early"], figures["end"]
    targets = []

    def add(key: str, target: str, value: float | None, limit: float) -> None:
        met = None if value is None else value <= limit
        targets.append(
            {"figure": key, "target": target, "value": value, "limit": limit, "met": met}
        )

    for key, _, _ in FIGURES:
        ratio = end[key] / early[key] if early[key] and end[key] is not None else None
        add(key, f"flat: end <= x{FLAT} early", ratio, FLAT)
    add(
        "live_parts",
        f"max <= {PARTS_PER_PARTITION} P",
        end["live_parts_max"],
        PARTS_PER_PARTITION * partitions,
    )
    view = figures["view_bytes"]
    add(
        "bucket_bytes",
        f"<= {VIEW_FACTOR:g}x the view",
        end["bucket_bytes"] / view if view and end["bucket_bytes"] is not None else None,
        VIEW_FACTOR,
    )
    for name in ("early", "end"):
        add(
            "cold_restart_vs_read_once",
            f"{name} <= {RESTART_FACTOR:g}x one read",
            figures[name]["cold_restart_vs_read_once"],
            RESTART_FACTOR,
        )
    return targets


def _not_measured(figures: dict[str, Any]) -> list[str]:
    """The figures of the table that hold no measurement."""
    missing = [
        f"{name}.{key}"
        for name in ("early", "end")
        for key, _, _ in FIGURES
        if figures[name][key] is None
    ]
    return missing + ([] if figures["view_bytes"] else ["view_bytes"])


def _show(value: float | None, unit: str) -> str:
    if value is None:
        return "not measured"
    if unit == "B":
        return f"{value:,.0f} B"
    if unit == "x":
        return f"x{value:.1f}"
    if unit == "":
        return f"{value:,.1f}".removesuffix(".0")
    return f"{value:.1f} ms" if unit == "ms" else f"{value:.3f} s"


def _verdict(target: dict[str, Any]) -> str:
    met = {True: "met", False: "MISSED", None: "not measured"}[target["met"]]
    return f"{target['target']}: {met}"


def _report(figures: dict[str, Any], say: Say) -> None:
    early, end, targets = figures["early"], figures["end"], figures["targets"]
    say("")
    say(
        f"{'figure':<26}{'at tick ~' + str(early['ticks'][1]):>16}{'at the end':>16}{'end/early':>11}  target"
    )
    for key, label, unit in FIGURES:
        mine = [t for t in targets if t["figure"] == key]
        ratio = mine[0]["value"]
        say(
            f"{label:<26}{_show(early[key], unit):>16}{_show(end[key], unit):>16}"
            f"{'-' if ratio is None else f'{ratio:.2f}':>11}  {'; '.join(map(_verdict, mine))}"
        )
    met = sum(t["met"] is True for t in targets)
    view = figures["view"]
    say(
        f"windows: ticks {early['ticks']} ({early['samples']} samples, {early['appends']} appends) and "
        f"{end['ticks']} ({end['samples']} samples, {end['appends']} appends); live parts max at the end "
        f"{end['live_parts_max']}; the consolidated view {view['bytes']:,} B in {view['parts']} parts, "
        f"{view['updates']:,} updates (since {{{view['since']}}}, upper {{{view['upper']}}})"
    )
    say(
        f"targets met: {met} of {len(targets)}; every figure measured: {figures['measured']}"
        + (f" (missing {', '.join(figures['not_measured'])})" if figures["not_measured"] else "")
    )
    say(f"shard equals desired: {figures['correct']} (before and after the last restarts)")


def _chart(figures: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeline = figures["timeline"]
    ticks = [s["tick"] for s in timeline]
    fig, (state, counts, bucket) = plt.subplots(1, 3, figsize=(13, 3.6))
    state.plot(ticks, [s["state_bytes"] / 1024 for s in timeline], lw=1)
    state.set_title("state version (KiB)")
    for key, label in (("live_batches", "live batches"), ("live_parts", "live parts")):
        counts.plot(ticks, [s[key] for s in timeline], lw=1, label=label)
    counts.set_title("live batches and parts")
    for key, label in (
        ("bucket_bytes", "bucket"),
        ("part_bytes", "parts"),
        ("metadata_bytes", "metadata"),
    ):
        bucket.plot(ticks, [s[key] / 1024 for s in timeline], lw=1, label=label)
    bucket.axhline(
        VIEW_FACTOR * figures["view_bytes"] / 1024,
        ls="--",
        color="grey",
        label=f"{VIEW_FACTOR:g}x the consolidated view",
    )
    bucket.set_title("bucket (KiB)")
    for axis in (state, counts, bucket):
        for name in ("early", "end"):
            low, high = figures[name]["ticks"]
            axis.axvspan(low, high, color="#ddd", alpha=0.5, lw=0)
        axis.set_xlabel("last durable tick (shaded: the windows)")
    counts.legend(fontsize=8)
    bucket.legend(fontsize=8)
    workload = figures["workload"]
    fig.suptitle(
        f"mvsink bench soak: {workload['keys']:,} keys, {workload['change']:.0%} change a tick, "
        f"{workload['ticks']:,} ticks, P={workload['partitions']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
