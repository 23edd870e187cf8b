"""Two benchmarks of mvsink's correction state, each with a same-run baseline.

`mvsink bench restart`: a shard of `updates` updates already equal to desired, then the write
service restarts, (a) warm: from its checkpoints, (b) cold: its checkpoints deleted (a new
deployment or a lost state), so it must fold all of desired and read the whole shard back.
Measured per case: the first staging job after the restart (the resume work) and process start
to the next upper, against the baseline of one plain read of the shard (GET + Parquet decode of
every part); and the part bytes written by the resume, whose goal is 0 (nothing rewritten).

`mvsink bench readonly`: a writing replica and a read-only replica of one sink on one shard,
fed the same ticks at a fixed pace for `minutes`; the read-only replica's correction state
(its `mvsink_write_corrections` gauge, summed over partitions) is sampled against the updates
in flight (published but not yet under the shard's upper). Goal: flat, <= 2x in flight. Each
sample also holds the state versions the shard's log retains and each replica's S3 requests
per hour since the sample before (each replica reaches the store through its own counting
proxy, `mvsink.bench.s3proxy`), the first steady sample next to the last.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from mvsink import Say
from mvsink.bench.compare import BLOCK, save_figures, sink_config
from mvsink.bench.contenders import MvsinkSystem, scrape
from mvsink.bench.cycle import STAGED
from mvsink.bench.s3proxy import ProxyProcess
from mvsink.bench.workload import (
    BenchError,
    EncodedTick,
    Feeder,
    Workload,
    encode_ticks,
)
from mvsink.core.codec import encode
from mvsink.core.frontier import Frontier
from mvsink.core.messages import Progress
from mvsink.core.settings import FOLD_INTERVAL
from mvsink.io.config import Config, state_dir
from mvsink.io.s3 import s3_client
from mvsink.shard import Shard, open_shard
from mvsink.tools.provision import provision


def wait_upper(system: MvsinkSystem, upper: int, what: str, timeout: float = 900) -> float:
    deadline = time.monotonic() + timeout
    while system.durable(wait=BLOCK) < upper:
        system.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: the shard did not reach {{{upper}}} in {timeout:.0f}s")
    return time.monotonic()


def empty_tick(time_: int) -> EncodedTick:
    return EncodedTick(time_, 0, [], encode(Progress(Frontier.at(time_ + 1))))


def first_job(log: Path, after: int, wait: float = 10.0) -> tuple[float, int]:
    """(seconds, updates) of the first staging job logged after byte offset `after`, waiting up
    to `wait` seconds for its line; (nan, -1) if none comes.

    The driver logs a staging job after its batch is reported, so the append, and with it the
    upper a caller waited for, can land before the line does (a descheduled driver)."""
    deadline = time.monotonic() + wait
    while True:
        found = STAGED.search(log.read_text(errors="replace")[after:])
        if found:
            return float(found["total"]), int(found["updates"])
        if time.monotonic() > deadline:
            return float("nan"), -1
        time.sleep(0.1)


def run_restart(
    config: Config, updates: int, partitions: int, out: Path, say: Say
) -> dict[str, Any]:
    """The restart benchmark (module docs); figures also in `out/restart.json`."""
    run_id = f"restart-{uuid.uuid4().hex[:6]}"
    # The cold case rebuilds from all of desired, which needs the topic whole: no trimming.
    sink = sink_config(config, run_id, partitions, desired_trim_interval=0.0)
    provision(sink)
    ticks, _ = encode_ticks(sink, Workload(updates, 0.0, 0, partitions), say)
    feeder = Feeder(config.kafka_bootstrap)
    logs = state_dir() / "bench" / run_id
    system = MvsinkSystem(sink, logs)
    say(f"loading {updates:,} updates into shard {run_id} ...")
    system.start()
    started = time.monotonic()
    try:
        system.ends[0] = feeder.feed(sink, ticks[0])
        wait_upper(system, 1, "the initial load")
        say(
            f"  loaded in {time.monotonic() - started:.1f}s (includes process start); idling "
            f"{FOLD_INTERVAL + 3:.0f}s so the write service folds the read-back as a running sink does"
        )
        time.sleep(FOLD_INTERVAL + 3)
    finally:
        system.stop()
    shard = open_shard(sink.shard_id, None, sink.s3)
    baseline = read_once(shard)
    say(
        f"baseline: one read of the shard ({baseline['parts']} parts, {baseline['bytes'] / 2**20:.1f} MiB): "
        f"{baseline['seconds']:.2f}s"
    )
    figures: dict[str, Any] = {
        "updates": updates,
        "partitions": partitions,
        "shard_read_once_s": round(baseline["seconds"], 3),
        "shard_bytes": baseline["bytes"],
    }
    for case, tick in (("warm", 1), ("cold", 2)):
        if case == "cold":
            client = s3_client(sink.s3)
            for item in client.list_objects(
                sink.s3.bucket, prefix=f"sinks/{sink.sink_id}/write/", recursive=True
            ):
                client.remove_object(sink.s3.bucket, item.object_name)
        write_log = system.logs / "write.log"
        offset = write_log.stat().st_size
        parts_before = part_bytes(shard)
        restarted = time.monotonic()
        system.start()
        try:
            system.ends[tick] = feeder.feed(sink, empty_tick(tick))
            reached = wait_upper(system, tick + 1, f"the {case} restart")
            seconds, rewritten_updates = first_job(write_log, offset)
        finally:
            system.stop()
        rewritten = part_bytes(shard) - parts_before
        figures[f"{case}_resume_job_s"] = round(seconds, 3)
        figures[f"{case}_start_to_upper_s"] = round(reached - restarted, 2)
        figures[f"{case}_resume_vs_read_once"] = round(seconds / baseline["seconds"], 2)
        figures[f"{case}_bytes_rewritten"] = rewritten
        say(
            f"{case} restart: resume job {seconds:.2f}s = x{seconds / baseline['seconds']:.2f} one read of the "
            f"shard (goal <= x2); process start to next upper {reached - restarted:.1f}s; "
            f"{rewritten} bytes rewritten ({max(rewritten_updates, 0)} updates; goal 0)"
        )
    save_figures(out, "restart", figures, say, logs)
    return figures


def part_bytes(shard: Shard) -> int:
    return sum(p.bytes for b in shard.state().batches for p in b.parts)


def read_once(shard: Shard) -> dict[str, float]:
    """Read every part of the shard once, as any reader does (`Shard.read_parts`: parallel GETs
    and Parquet decode), without consolidating."""
    state = shard.state()
    selected = shard.parts_for(None, Frontier.minimum(), state.upper, state=state)
    started = time.monotonic()
    shard.read_parts(selected)
    return {
        "seconds": time.monotonic() - started,
        "bytes": float(sum(c.part.bytes for c in selected)),
        "parts": float(len(selected)),
    }


def run_readonly(
    config: Config,
    keys: int,
    change: float,
    minutes: float,
    interval: float,
    partitions: int,
    out: Path,
    say: Say,
    sample_every: float = 10.0,
) -> dict[str, Any]:
    """The read-only benchmark (module docs), sampled at the first tick of each `sample_every`
    seconds; figures also in `out/readonly.json`."""
    run_id = f"ro-{uuid.uuid4().hex[:6]}"
    leader = sink_config(config, f"{run_id}-leader", partitions, shard_id=run_id)
    follower = sink_config(config, f"{run_id}-ro", partitions, shard_id=run_id, read_only=True)
    ticks_needed = int(minutes * 60 / interval) + 1
    for each in (leader, follower):
        provision(each)
    workload = Workload(keys, change, ticks_needed, partitions)
    ticks, _ = encode_ticks(leader, workload, say)
    feeder = Feeder(config.kafka_bootstrap)
    logs = state_dir() / "bench" / run_id
    # Each replica reaches the store through its own counting proxy (`mvsink.bench.s3proxy`).
    proxies = [ProxyProcess(c.s3.endpoint).__enter__() for c in (leader, follower)]
    systems = [
        MvsinkSystem(replace(c, s3=replace(c.s3, endpoint=proxy.endpoint)), logs / name)
        for c, proxy, name in zip((leader, follower), proxies, ("leader", "ro"), strict=True)
    ]
    shard = open_shard(run_id, None, leader.s3)
    for system in systems:
        system.start()
    samples: list[dict[str, float]] = []
    say(
        f"read-only replica beside a writing one: {minutes:g} min, one tick every {interval:g}s, "
        f"{2 * workload.changed:,} updates per tick"
    )
    try:
        # The paced clock starts once the writing replica has appended the first tick: the
        # services' start (Spark's above all) is not part of the window sampled.
        for system in systems:
            system.ends[0] = feeder.feed(system.config, ticks[0])
        wait_upper(systems[0], 1, "the writing replica's first tick")
        started = last = time.monotonic()
        say("  the writing replica appended tick 0; pacing the rest")
        for tick in ticks[1:]:
            due = started + tick.time * interval
            while time.monotonic() < due:
                time.sleep(min(0.2, max(0.0, due - time.monotonic())))
            for system in systems:
                system.ends[tick.time] = feeder.feed(system.config, tick)
            upper = systems[0].durable()
            for system in systems:
                system.check_alive()
            if tick.time % max(1, round(sample_every / interval)) == 0:
                gauge = scrape(logs / "ro" / "write.log").get("mvsink_write_corrections", 0.0)
                in_flight = sum(t.updates for t in ticks[upper : tick.time + 1])
                now = time.monotonic()
                rates = [proxy.per_hour(last, now) or 0.0 for proxy in proxies]
                sample = {
                    "t_s": round(now - started, 1),
                    "corrections": gauge,
                    "in_flight": float(in_flight),
                    "tick": float(tick.time),
                    "upper": float(upper),
                    "retained_versions": float(len(shard.retained_seqnos())),
                    "leader_s3_per_hour": round(rates[0]),
                    "standby_s3_per_hour": round(rates[1]),
                }
                samples.append(sample)
                last = now
                say(
                    f"  {sample['t_s']:>6.0f}s tick {tick.time:>5} upper {upper:>5}: read-only corrections "
                    f"{gauge:>10,.0f}, updates in flight {in_flight:>10,}; {sample['retained_versions']:.0f} "
                    f"versions retained; S3 requests/h writing {rates[0]:,.0f}, standby {rates[1]:,.0f}"
                )
    finally:
        for system in systems:
            system.stop()
        for proxy in proxies:
            proxy.__exit__(None, None, None)
    steady = [s for s in samples if s["t_s"] >= 30] or samples
    ratio = max(s["corrections"] / max(s["in_flight"], 2 * workload.changed) for s in steady)
    figures = {
        "minutes": minutes,
        "interval_s": interval,
        "updates_per_tick": 2 * workload.changed,
        "corrections_first": steady[0]["corrections"],
        "corrections_last": steady[-1]["corrections"],
        "corrections_max": max(s["corrections"] for s in steady),
        "max_ratio_to_in_flight": round(ratio, 2),
        **{
            f"{key}_{name}": sample[key]
            for name, sample in (("first", steady[0]), ("last", steady[-1]))
            for key in ("retained_versions", "leader_s3_per_hour", "standby_s3_per_hour")
        },
        "samples": samples,
    }
    say(
        f"read-only corrections after warm-up: first {figures['corrections_first']:,.0f}, "
        f"last {figures['corrections_last']:,.0f}, max {figures['corrections_max']:,.0f}; "
        f"max ratio to the updates in flight x{ratio:.2f} (goal <= x2)"
    )
    say(
        "state versions retained, first -> last sample: "
        f"{figures['retained_versions_first']:.0f} -> {figures['retained_versions_last']:.0f}; "
        "S3 requests/h writing replica "
        f"{figures['leader_s3_per_hour_first']:,.0f} -> {figures['leader_s3_per_hour_last']:,.0f}, "
        "read-only replica "
        f"{figures['standby_s3_per_hour_first']:,.0f} -> {figures['standby_s3_per_hour_last']:,.0f}"
    )
    save_figures(out, "readonly", figures, say, logs)
    return figures
