"""`mvsink bench soak`: the pipeline for many ticks, to show the shard stays small and fast.

The workload of `mvsink bench` at soak size (default 10k keys, 10 % of them changing per tick:
retraction + insertion), fed closed loop to mint + write + append with compaction on and short
deletion bounds (replaced parts deleted after 1 s, versions pruned 12 s after they were
superseded, requests timing out after 5 s). A sampler thread reads the shard every second. Each figure is taken over two
windows of `window` ticks, one ending at the early tick (~100: the baseline of the same run) and
one at the end, and printed side by side with their ratio:

* state version bytes, live batches, live parts (median of the samples in the window);
* bucket bytes: the parts under the shard's prefix (live, and replaced ones not collected yet)
  and the metadata (retained state versions and the write checkpoints), apart and summed;
* compare-and-append p50/p99 (the append service logs each one's latency);
* snapshot time (`Shard.snapshot` at the upper) and freshness p50/p99 (tick published -> the
  shard's upper past it);
* cold restart: the services restarted with the write checkpoints deleted, the first staging
  job's seconds against one read of every live part of the shard (`steady.read_once`).

Targets (never asserted): each within x1.5 of its early value, live parts <= 64 P, bucket bytes
<= 3x the consolidated view (retain_history is 0: no retained history), cold restart <= 2x one
read. The view's size is measured at the end by a forced full merge. Nothing is timed by
assertion; the JSON (`soak.json`) and chart (`soak.png`) hold every sample.
"""

from __future__ import annotations

import re
import statistics
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mvsink import Say
from mvsink.bench.compare import (
    MvsinkSystem,
    Run,
    drive,
    percentile,
    save_figures,
)
from mvsink.bench.steady import empty_tick, first_job, read_once, sink_config, wait_upper
from mvsink.bench.workload import (
    EncodedTick,
    Feeder,
    Workload,
    encode_ticks,
)
from mvsink.config import Config, state_dir
from mvsink.provision import provision
from mvsink.s3 import s3_client
from mvsink.shard import Shard, open_shard
from mvsink.shard.compact import compact_once

#: The sink's shard timing: garbage goes within seconds, so bucket bytes show what is live.
SOAK_SHARD = {"shard_max_attempt_age": 5.0, "shard_request_timeout": 5.0, "shard_max_part_age": 20.0,
              "shard_min_grace": 30.0, "shard_part_grace": 1.0, "shard_version_grace": 12.0,
              "retain_history": 0}  # fmt: skip
_APPENDED = re.compile(r"appended \d+ parts for desc \S+ \[\{\d*\}, \{(\d+)\}\).* in ([\d.]+) ms")


@dataclass(frozen=True)
class Sample:
    """The shard as the sampler saw it."""

    upper: int
    state_bytes: int
    batches: int
    parts: int
    live_bytes: int
    #: Every part in the bucket under the shard: live, and replaced ones not yet collected.
    part_bytes: int
    #: State versions retained plus the write checkpoints.
    metadata_bytes: int
    snapshot_s: float | None

    @property
    def bucket_bytes(self) -> int:
        """Everything the sink keeps in the bucket."""
        return self.part_bytes + self.metadata_bytes


class Sampler:
    """Reads the shard every `interval` seconds on its own thread (its own shard handle)."""

    def __init__(self, config: Config, say: Say, interval: float = 1.0, snapshot_every: int = 5,
                 progress_every: int = 50) -> None:  # fmt: skip
        self.config, self.say = config, say
        self.progress_every, self._next_progress = progress_every, progress_every
        self.shard = open_shard(config.shard_id, None, config.s3)
        self.client = s3_client(config.s3)
        self.interval, self.snapshot_every = interval, snapshot_every
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        count = 0
        while not self._stop.wait(self.interval):
            try:
                sample = self.sample(count % self.snapshot_every == 0)
            except Exception:  # a version pruned between LIST and GET: the next sample is fine
                continue
            self.samples.append(sample)
            count += 1
            if sample.upper >= self._next_progress:
                self._next_progress = sample.upper + self.progress_every
                self.say(f"  tick {sample.upper}: {sample.batches} live batches, {sample.parts} "
                         f"parts, state {sample.state_bytes:,} B, parts in the bucket "
                         f"{sample.part_bytes / 2**10:,.0f} KiB, metadata {sample.metadata_bytes / 2**10:,.0f} KiB")  # fmt: skip

    def sample(self, snapshot: bool) -> Sample:
        state = self.shard.state()
        upper = state.upper.time or 0
        took = None
        if snapshot and upper:
            started = time.monotonic()
            self.shard.snapshot(upper)
            took = time.monotonic() - started
        sizes = {"parts": 0, "state": 0, "checkpoints": 0}
        for prefix, kind in ((f"{self.shard.prefix}/parts/", "parts"),
                             (f"{self.shard.prefix}/state/", "state"),
                             (f"sinks/{self.config.sink_id}/write/", "checkpoints")):  # fmt: skip
            for obj in self.client.list_objects(
                self.config.s3.bucket, prefix=prefix, recursive=True
            ):
                sizes[kind] += obj.size or 0
        return Sample(upper, len(state.to_bytes()), len(state.batches), len(state.part_keys),
                      state.total_bytes(), sizes["parts"], sizes["state"] + sizes["checkpoints"],
                      took)  # fmt: skip


def run_soak(
    config: Config, workload: Workload, early: int, window: int, out: Path, say: Say
) -> dict[str, Any]:
    """The soak benchmark (module docs); figures also in `out/soak.json` and `out/soak.png`."""
    early = max(window + 1, min(early, workload.ticks // 2))
    run_id = f"soak-{uuid.uuid4().hex[:6]}"
    sink = sink_config(config, run_id, workload.partitions, **SOAK_SHARD)
    provision(sink)
    ticks, final = encode_ticks(sink, workload, say)
    feeder, logs = Feeder(config.kafka_bootstrap), state_dir() / "bench" / run_id
    system, sampler = MvsinkSystem(sink, logs), Sampler(sink, say)
    shard = open_shard(sink.shard_id, None, sink.s3)
    say(f"soak: {workload.ticks} ticks; early window ticks {early - window + 1}..{early}")
    system.start()
    sampler.start()
    try:
        first = _drive(system, feeder, ticks[: early + 1], say, "early part")
        restart_early = _cold_restart(system, feeder, shard, ticks[early + 1], say)
        rest = _drive(system, feeder, ticks[early + 2 :], say, "long part")
        last = workload.ticks + 1
        late = Run("mvsink")
        system.finish(late, final)  # the shard equals the view (while the services still run)
        restart_end = _cold_restart(system, feeder, shard, empty_tick(last), say)
    finally:
        sampler.stop()
        system.stop()
    view_bytes, view_updates = _consolidated_view(sink, shard)
    windows = {
        "early": (early - window + 1, early),
        "end": (workload.ticks - window + 1, workload.ticks),
    }
    figures = _figures(sampler.samples, windows, logs / "append.log", first.freshness[-window:],
                       rest.freshness[-window:], restart_early, restart_end)  # fmt: skip
    figures.update(view_bytes=view_bytes, view_updates=view_updates, correct=late.correct,
                   workload={"keys": workload.keys, "change": workload.change,
                             "ticks": workload.ticks, "partitions": workload.partitions},
                   timeline=[{**s.__dict__, "bucket_bytes": s.bucket_bytes} for s in sampler.samples])  # fmt: skip
    _report(figures, workload.partitions, say)
    _chart(figures, save_figures(out, "soak", figures, say, logs).with_suffix(".png"))
    say(f"wrote {out / 'soak.png'}")
    return figures


def _drive(
    system: MvsinkSystem, feeder: Feeder, ticks: list[EncodedTick], say: Say, what: str
) -> Run:
    run = drive(system, feeder, ticks, 2, say)
    say(
        f"  {what}: {len(ticks)} ticks to upper {{{system.upper}}}, {run.updates_per_s:,.0f} updates/s"
    )
    return run


def _cold_restart(
    system: MvsinkSystem, feeder: Feeder, shard: Shard, tick: EncodedTick, say: Say
) -> dict[str, float]:
    """Restart the services with the write checkpoints deleted; publish `tick`; the first
    staging job's seconds against one read of the shard."""
    system.stop()
    baseline = read_once(shard)
    client = s3_client(system.config.s3)
    prefix = f"sinks/{system.config.sink_id}/write/"
    for item in client.list_objects(system.config.s3.bucket, prefix=prefix, recursive=True):
        client.remove_object(system.config.s3.bucket, item.object_name)
    log = system.logs / "write.log"
    offset = log.stat().st_size
    system.start()
    system.ends[tick.time] = feeder.feed(system.config, tick)
    wait_upper(system, tick.time + 1, "a cold restart")
    seconds, _ = first_job(log, offset)
    say(f"  cold restart at tick {tick.time}: first job {seconds:.2f}s, one read of the shard "
        f"{baseline['seconds']:.3f}s ({baseline['parts']:.0f} parts): x{seconds / baseline['seconds']:.1f}")  # fmt: skip
    return {
        "job_s": seconds,
        "read_once_s": baseline["seconds"],
        "ratio": seconds / baseline["seconds"],
    }


def _consolidated_view(sink: Config, shard: Shard) -> tuple[int, int]:
    """Bytes and updates of the live parts after a forced full merge (no lease left: the
    services are stopped, so `since` is the upper and the merge collapses all history)."""
    while compact_once(shard, sink.compaction_policy(), "soak", force=True) is not None:
        if len(shard.state().batches) <= 1:
            break
    state = shard.state()
    return state.total_bytes(), state.total_updates()


def _figures(samples: list[Sample], windows: dict[str, tuple[int, int]], append_log: Path,
             fresh_early: list[float], fresh_end: list[float], restart_early: dict[str, float],
             restart_end: dict[str, float]) -> dict[str, Any]:  # fmt: skip
    appends = [(int(m.group(1)), float(m.group(2)))
               for m in _APPENDED.finditer(append_log.read_text(errors="replace"))]  # fmt: skip
    out: dict[str, Any] = {}
    for name, (low, high) in windows.items():
        chosen = [s for s in samples if low <= s.upper <= high + 1]
        latencies = [ms for upper, ms in appends if low < upper <= high + 1]
        snapshots = [s.snapshot_s for s in chosen if s.snapshot_s is not None]
        fresh = fresh_early if name == "early" else fresh_end
        restart = restart_early if name == "early" else restart_end
        out[name] = {
            "ticks": [low, high],
            "samples": len(chosen),
            "state_bytes": _median([s.state_bytes for s in chosen]),
            "live_batches": _median([s.batches for s in chosen]),
            "live_parts": _median([s.parts for s in chosen]),
            "live_parts_max": max((s.parts for s in chosen), default=None),
            "part_bytes": _median([s.part_bytes for s in chosen]),
            "part_bytes_max": max((s.part_bytes for s in chosen), default=None),
            "metadata_bytes": _median([s.metadata_bytes for s in chosen]),
            "bucket_bytes": _median([s.bucket_bytes for s in chosen]),
            "cas_p50_ms": percentile(latencies, 50),
            "cas_p99_ms": percentile(latencies, 99),
            "snapshot_s": _median(snapshots),
            "freshness_p50_s": percentile(fresh, 50),
            "freshness_p99_s": percentile(fresh, 99),
            "cold_restart_s": restart["job_s"],
            "read_once_s": restart["read_once_s"],
            "cold_restart_vs_read_once": restart["ratio"],
        }
    return out


def _median(values: list[float] | list[int]) -> float | None:
    return float(statistics.median(values)) if values else None


FLAT = ("state_bytes", "live_batches", "live_parts", "part_bytes", "metadata_bytes", "bucket_bytes",
        "cas_p50_ms", "cas_p99_ms",
        "snapshot_s", "freshness_p50_s", "freshness_p99_s", "cold_restart_s")  # fmt: skip


def _report(figures: dict[str, Any], partitions: int, say: Say) -> None:
    early, end = figures["early"], figures["end"]
    say(f"{'figure':<28}{'ticks ' + '..'.join(map(str, early['ticks'])):>18}"
        f"{'ticks ' + '..'.join(map(str, end['ticks'])):>18}{'end/early':>11}  target")  # fmt: skip
    for name in FLAT:
        a, b = early[name], end[name]
        ratio = b / a if a and b is not None else float("nan")
        verdict = "met" if ratio <= 1.5 else "MISSED"
        say(f"{name:<28}{a if a is not None else float('nan'):>18,.3f}"
            f"{b if b is not None else float('nan'):>18,.3f}{ratio:>11.2f}  <= x1.5 flat: {verdict}")  # fmt: skip
    limit = 64 * partitions
    say(f"live parts max at the end {end['live_parts_max']} (<= 64 P = {limit}: "
        f"{'met' if (end['live_parts_max'] or 0) <= limit else 'MISSED'})")  # fmt: skip
    view = figures["view_bytes"]
    for name in ("part_bytes", "part_bytes_max", "bucket_bytes"):
        value = end[name] or 0
        say(f"{name} at the end {value:,.0f} = x{value / view:.2f} the consolidated view ({view:,} bytes, "
            f"{figures['view_updates']:,} updates; <= x3: {'met' if value <= 3 * view else 'MISSED'})")  # fmt: skip
    for name in ("early", "end"):
        ratio = figures[name]["cold_restart_vs_read_once"]
        say(f"cold restart ({name}) x{ratio:.1f} one read of the shard (<= x2: "
            f"{'met' if ratio <= 2 else 'MISSED'})")  # fmt: skip
    say(f"shard equals desired: {figures['correct']}")


def _chart(figures: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeline = figures["timeline"]
    uppers = [s["upper"] for s in timeline]
    series = (("state version (KiB)", "state_bytes", 1024), ("live parts", "parts", 1),
              ("parts in the bucket (KiB)", "part_bytes", 1024))  # fmt: skip
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    for axis, (title, key, scale) in zip(axes, series, strict=True):
        axis.plot(uppers, [s[key] / scale for s in timeline], lw=1)
        axis.set_title(title)
        axis.set_xlabel("tick (shard upper)")
    workload = figures["workload"]
    fig.suptitle(f"mvsink bench soak: {workload['keys']:,} keys, {workload['change']:.0%} change a tick, "
                 f"{workload['ticks']:,} ticks, P={workload['partitions']}")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
