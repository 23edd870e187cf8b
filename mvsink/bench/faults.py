"""`mvsink bench faults`: the fault matrix. The pipeline under a ticking upstream, and one fault
after another; after each, every service must still run, the shard must equal the view at every
upper it reaches, and it must catch up.

```
 ticker (this process): K keys, C of them change a tick (retraction + insertion), a tick a
   second, through `DesiredProducer`; paused while Kafka is away (the upstream is not under
   test here)
 mint, write, append: processes, as `mvsink demo` runs them, readiness bound `READY_BOUND`
 checker thread: every upper the shard reaches is read (`Shard.snapshot`) and compared with
   the ticker's view at that upper (rows with a diff other than 1 count as duplicates)
 stack: an embedded Kafka + MinIO of this run alone (`<state>/bench/<run>/stack`), MinIO
   behind a Toxiproxy of this run
```

Faults, each for `outage` seconds: `kafka-kill` and `minio-kill` (`kill -9`, then `Stack.up`
starts it again on the address it had), `kafka-stop` and `minio-stop` (SIGSTOP, then SIGCONT),
`minio-slow` (every S3 response delayed past the shard's `request_timeout`: the services reach
MinIO through Toxiproxy, `mvsink.stack.toxiproxy`, which adds a latency toxic),
`mint-kill`, `write-kill`, `append-kill` (`kill -9` of the service, restarted at once as a
supervisor would), and `mint-pause`, `write-pause`, `append-pause` (SIGSTOP of the service for
longer than the longest of the shard's bounds, `pause_seconds`, then SIGCONT: a process that
stalls anywhere, between an age check and its commit too, must not break what the bounds
protect). Per fault: whether any service exited (it must not, apart from the one killed), how
long each service's `/readyz` took to turn unready during a dependency's outage, seconds from
recovery to the first append and to convergence (the shard's upper past every tick published
before recovery), uppers whose contents differed from the view (data lost or duplicated) and
parts the latest version references that are gone (dangling). At the end, the services stop,
and after `min_grace` a sweep must leave no part unreferenced. `faults.json` holds the table.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from mvsink import Say
from mvsink.bench import FAULTS, FAULTS_MIN_GRACE
from mvsink.bench.compare import save_figures
from mvsink.bench.workload import BenchError
from mvsink.core.frontier import Frontier
from mvsink.core.rows import parse_row_schema
from mvsink.io.config import Config, Topics, cache_dir, state_dir
from mvsink.io.s3 import ensure_bucket, s3_client
from mvsink.shard import Shard, open_shard
from mvsink.stack import toxiproxy
from mvsink.stack.manager import Stack
from mvsink.stack.procs import free_ports
from mvsink.stack.state import load_records, stack_config
from mvsink.stack.toxiproxy import Toxiproxy
from mvsink.tools.demo import SERVICES, start_service, stop_services
from mvsink.tools.provision import provision
from mvsink.upstream.producer import DesiredProducer

ROW_SCHEMA = "key string not null, value long"
#: The services' readiness bound here (seconds), and short deletion bounds so the closing sweep
#: can run a little after the services stop. `retain_history` keeps the uppers the checker
#: reads from being compacted away under it.
READY_BOUND = 10.0
SINK: dict[str, Any] = {
    "ready_bound": READY_BOUND,
    "retain_history": 1000,
    "shard_max_attempt_age": 5.0,
    "shard_version_grace": 10.0,
    "shard_part_grace": 2.0,
    "shard_request_timeout": 4.0,
}


def grace_bounds(min_grace: float) -> dict[str, Any]:
    """The longest shard bounds of the run, from its `min_grace` (`max_part_age` and
    `reader_lease` two thirds of it): a `*-pause` fault lasts past the longest, so a shorter
    grace is a shorter matrix under the same faults."""
    return {
        "shard_min_grace": min_grace,
        "shard_max_part_age": 2 * min_grace / 3,
        "shard_reader_lease": 2 * min_grace / 3,
    }


def pause_seconds(config: Config) -> float:
    """How long a `*-pause` fault stops a service: past the longest of the shard's bounds."""
    timing = config.shard_timing()
    return 2.0 + max(
        timing.max_attempt_age,
        timing.max_part_age,
        timing.min_grace,
        timing.part_grace,
        timing.version_grace,
        timing.reader_lease,
    )


class Ticker(threading.Thread):
    """The upstream: a view of `keys` keys, `change` of them changing a tick."""

    def __init__(self, config: Config, keys: int, change: int, interval: float) -> None:
        super().__init__(name="ticker", daemon=True)
        self.producer = DesiredProducer(
            config, parse_row_schema(ROW_SCHEMA), f"faults.{config.sink_id}"
        )
        self.frontier = self.producer.start().time or 0
        self.keys, self.change, self.interval = keys, change, interval
        self.values = dict.fromkeys(range(keys), -1)
        self.history: list[tuple[int, int, int, int]] = []  # key, value, time, diff
        self.lock = threading.Lock()
        self.running = threading.Event()
        self.running.set()
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopping.wait(self.interval):
                if self.running.is_set():
                    self.tick()
        except BaseException as error:  # reported by `check`
            self.error = error

    def tick(self) -> None:
        t = self.frontier
        rows = []
        for key in sorted({(t * self.change + i) % self.keys for i in range(self.change)}):
            if self.values[key] >= 0:
                rows.append((key, self.values[key], t, -1))
            self.values[key] = t
            rows.append((key, t, t, 1))
        with self.lock:  # the view includes them before the shard can: before the frontier moves
            self.history.extend(rows)
        self.producer.send(
            pa.table(
                {
                    "key": pa.array([f"k{r[0]}" for r in rows], pa.string()),
                    "value": pa.array([r[1] for r in rows], pa.int64()),
                    "_time": pa.array([r[2] for r in rows], pa.int64()),
                    "_diff": pa.array([r[3] for r in rows], pa.int64()),
                }
            )
        )
        self.producer.advance_to(Frontier.at(t + 1))
        self.frontier = t + 1

    def view(self, as_of: int) -> dict[tuple[str, int], int]:
        """The view at `as_of`: updates at times before it, consolidated."""
        counts: Counter[tuple[str, int]] = Counter()
        with self.lock:
            for key, value, t, diff in self.history:
                if t < as_of:
                    counts[(f"k{key}", value)] += diff
        return {row: n for row, n in counts.items() if n}

    def check(self) -> None:
        if self.error is not None:
            raise BenchError(f"the upstream failed: {self.error!r}")


class Checker(threading.Thread):
    """Reads every upper the shard reaches and compares it with the view there."""

    def __init__(self, shard: Shard, ticker: Ticker) -> None:
        super().__init__(name="checker", daemon=True)
        self.shard, self.ticker = shard, ticker
        self.checked, self.duplicates = 0, 0
        self.mismatches: list[int] = []
        self.upper = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.3):
            try:
                upper = self.shard.state().upper.time or 0
                if upper <= self.upper:
                    continue
                rows = self.shard.snapshot(upper).to_pylist()
            except Exception:  # S3 away: the next round reads it
                continue
            got = {(r["key"], r["value"]): r["_diff"] for r in rows}
            self.duplicates += sum(1 for d in got.values() if d != 1)
            if got != self.ticker.view(upper):
                self.mismatches.append(upper)
            self.checked, self.upper = self.checked + 1, upper


def _ready(port: int) -> int:
    """The status of the service's `/readyz` (0 if nothing answers)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=3) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0


class Pipeline:
    """mint, write and append as processes with fixed metrics ports."""

    def __init__(self, config: Config, logs: Path) -> None:
        self.config, self.logs = config, logs
        self.ports = dict(zip(SERVICES, free_ports(len(SERVICES)), strict=True))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str) -> None:
        self.procs[name] = start_service(
            self.config, name, self.logs, MVSINK_METRICS_PORT=str(self.ports[name])
        )

    def exited(self) -> dict[str, int]:
        return {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}

    def stop(self) -> None:
        stop_services(self.procs.values())


def run_faults(
    config_path: str | None,
    faults: list[str],
    outage: float,
    keys: int,
    change: int,
    interval: float,
    out: Path,
    say: Say,
    min_grace: float = FAULTS_MIN_GRACE,
) -> dict[str, Any]:
    """The fault matrix (module docs) for the sink settings of `config_path` (and the
    environment) on a stack of its own, the shard's longest bounds from `min_grace`
    (`grace_bounds`); the figures, also in `out/faults.json`."""
    unknown = set(faults) - set(FAULTS)
    if unknown:
        raise BenchError(f"unknown faults {sorted(unknown)}; known: {', '.join(FAULTS)}")
    run = f"faults-{uuid.uuid4().hex[:6]}"
    home = state_dir() / "bench" / run
    stack = Stack(home / "stack", cache_dir(), say)
    api_port, listen_port = free_ports(2)
    proxy = Toxiproxy(home / "toxiproxy", api_port)
    try:
        endpoints = stack.up()
        proxy.start(toxiproxy.ensure_binary(cache_dir(), say), say)
        s3_endpoint = proxy.proxy("minio", listen_port, endpoints.s3_endpoint)
        base = stack_config(
            config_path,
            env={
                **os.environ,
                "MVSINK_KAFKA_BOOTSTRAP": endpoints.kafka_bootstrap,
                "MVSINK_S3_ENDPOINT": s3_endpoint,
                "MVSINK_S3_SECURE": "false",
                "MVSINK_S3_ACCESS_KEY": endpoints.s3_access_key,
                "MVSINK_S3_SECRET_KEY": endpoints.s3_secret_key,
            },
        )
        config = replace(
            base,
            sink_id=run,
            shard_id=run,
            row_schema=ROW_SCHEMA,
            topics=Topics.for_sink(run, base.topics.frontiers),
            **SINK,
            **grace_bounds(min_grace),
        )
        ensure_bucket(s3_client(config.s3), config.s3.bucket)
        provision(config)
        shard = open_shard(config.shard_id, None, config.s3, config.shard_timing())
        figures = _matrix(
            config, shard, home, faults, outage, keys, change, interval, Injector(stack, proxy), say
        )
    finally:
        proxy.stop()
        stack.down()
    _report(figures, say)
    save_figures(out, "faults", figures, say, home / "logs")
    return figures


@dataclass(frozen=True)
class Injector:
    """What the faults act on: the stack's processes, and the proxy in front of MinIO."""

    stack: Stack
    proxy: Toxiproxy


def _matrix(
    config: Config,
    shard: Shard,
    home: Path,
    faults: list[str],
    outage: float,
    keys: int,
    change: int,
    interval: float,
    injector: Injector,
    say: Say,
) -> dict[str, Any]:
    pipeline = Pipeline(config, home / "logs")
    ticker = Ticker(config, keys, change, interval)
    checker = Checker(shard, ticker)
    rows: list[dict[str, Any]] = []
    try:
        for name in SERVICES:
            pipeline.start(name)
        ticker.start()
        checker.start()
        say(
            f"fault matrix {config.sink_id}: {keys} keys, {change} change a tick; services "
            f"starting ..."
        )
        _wait(lambda: checker.upper >= ticker.frontier > 0, 300, "the first convergence", ticker)
        _all_ready(pipeline, ticker, "at the start")
        say(f"converged at {{{checker.upper}}}; faults of {outage:.0f}s each: {', '.join(faults)}")
        for fault in faults:
            rows.append(_inject(fault, outage, injector, pipeline, ticker, checker, say))
        ticker.running.clear()
        final = ticker.frontier
        _wait(lambda: checker.upper >= final, 180, "the final convergence", ticker)
    finally:
        ticker.stopping.set()
        checker.stopping.set()
        pipeline.stop()
    say(f"services stopped; waiting {config.shard_min_grace:.0f}s (min_grace) for the sweep ...")
    time.sleep(config.shard_min_grace + 1)
    swept = shard.sweep(config.shard_min_grace)
    unreferenced = len(_stored_parts(shard) - set(shard.referenced_keys()))
    figures = {
        "run": config.sink_id,
        "outage_s": outage,
        "keys": keys,
        "change": change,
        "faults": rows,
        "uppers_checked": checker.checked,
        "mismatches": checker.mismatches,
        "duplicates": checker.duplicates,
        "final_upper": final,
        "parts_swept": len(swept.parts_deleted),
        "unreferenced_after_sweep": unreferenced,
    }
    figures["passed"] = (
        not checker.mismatches
        and not checker.duplicates
        and unreferenced == 0
        and all(not r["exited"] and not r["dangling"] for r in rows)
    )
    return figures


def _wait(predicate: Any, timeout: float, what: str, ticker: Ticker) -> float:
    started = time.monotonic()
    while not predicate():
        ticker.check()
        if time.monotonic() - started > timeout:
            raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)
    return time.monotonic() - started


def _inject(
    fault: str,
    outage: float,
    injector: Injector,
    pipeline: Pipeline,
    ticker: Ticker,
    checker: Checker,
    say: Say,
) -> dict[str, Any]:
    """One fault: inject, hold for `outage`, recover; its row of the table."""
    target, how = fault.split("-")
    killed_service = target in SERVICES and how == "kill"
    unready: dict[str, float] = {}
    lost_before = len(checker.mismatches) + checker.duplicates
    started = time.monotonic()
    if target in SERVICES and how == "pause":
        process = pipeline.procs[target]
        process.send_signal(signal.SIGSTOP)
        time.sleep(pause_seconds(pipeline.config))
        process.send_signal(signal.SIGCONT)
    elif killed_service:
        pipeline.procs[target].kill()
        pipeline.procs[target].wait(30)
        pipeline.start(target)  # a supervisor restarts it
    else:
        if target == "kafka":
            ticker.running.clear()
        pid = load_records(injector.stack.home)[target].pid
        assert pid is not None
        if how == "slow":  # past every S3 call's timeout: the services see MinIO hang
            latency = int(1000 * (pipeline.config.shard_request_timeout + 1))
            injector.proxy.add_latency("minio", "slow", latency)
        else:
            os.kill(pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        while time.monotonic() - started < outage:
            for name, port in pipeline.ports.items():
                if name not in unready and _ready(port) == 503:
                    unready[name] = round(time.monotonic() - started, 1)
            time.sleep(0.5)
        if how == "slow":
            injector.proxy.remove("minio", "slow")
        elif how == "kill":
            injector.stack.up()
        else:
            os.kill(pid, signal.SIGCONT)
    recovered, upper = time.monotonic(), checker.upper
    ticker.running.set()
    published = ticker.frontier
    first = _wait(lambda: checker.upper > upper, 300, f"an append after {fault}", ticker)
    _wait(lambda: checker.upper > published, 300, f"convergence after {fault}", ticker)
    converged = time.monotonic() - recovered
    _all_ready(pipeline, ticker, f"after {fault}")
    ready = time.monotonic() - recovered
    exited = dict(pipeline.exited())
    for name in exited:  # counted as a failure, restarted so the matrix goes on
        pipeline.start(name)
    state = checker.shard.state()
    listed = _stored_parts(checker.shard)
    row = {
        "fault": fault,
        "outage_s": round(recovered - started, 1),
        "exited": exited,
        "unready_after_s": unready,
        "first_append_s": round(first, 1),
        "converged_s": round(converged, 1),
        "ready_s": round(ready, 1),
        "upper": checker.upper,
        "lost": len(checker.mismatches) + checker.duplicates - lost_before,
        "dangling": len(state.part_keys - listed),
    }
    say(
        f"  {fault:<12} down {row['outage_s']:.1f}s, exited {exited or 'none'}, unready after "
        f"{unready or '-'}; from recovery: first append {first:.1f}s, converged "
        f"{converged:.1f}s, all ready {ready:.1f}s; lost {row['lost']}, dangling "
        f"{row['dangling']}"
    )
    return row


def _stored_parts(shard: Shard) -> set[str]:
    """Keys of every part stored under the shard's prefix."""
    return {o.key for o in shard.blob.list(f"{shard.prefix}/parts/", recursive=True)}


def _all_ready(pipeline: Pipeline, ticker: Ticker, when: str) -> None:
    _wait(
        lambda: all(_ready(p) == 200 for p in pipeline.ports.values()),
        120,
        f"every service ready {when}",
        ticker,
    )


def _report(figures: dict[str, Any], say: Say) -> None:
    say("")
    say("seconds: down = fault to recovery; unready = fault to /readyz 503, per service; then,")
    say("from recovery: the first append, convergence (every tick published before recovery")
    say("durable), every service ready again")
    say(
        f"{'fault':<13}{'down':>6}  {'services exited':<16}{'unready':<30}"
        f"{'first append':>13}{'converged':>10}{'ready':>7}{'lost':>6}{'dangling':>9}"
    )
    for row in figures["faults"]:
        unready = ", ".join(f"{n} {s}" for n, s in row["unready_after_s"].items()) or "-"
        exited = ", ".join(f"{n} rc={rc}" for n, rc in row["exited"].items()) or "none"
        say(
            f"{row['fault']:<13}{row['outage_s']:>6.1f}  {exited:<16}{unready:<30}"
            f"{row['first_append_s']:>13.1f}{row['converged_s']:>10.1f}{row['ready_s']:>7.1f}"
            f"{row['lost']:>6}{row['dangling']:>9}"
        )
    say(
        f"uppers checked {figures['uppers_checked']}: mismatches {len(figures['mismatches'])}, "
        f"duplicates {figures['duplicates']}; swept {figures['parts_swept']} leaked parts, "
        f"{figures['unreferenced_after_sweep']} unreferenced after the sweep"
    )
    say(f"fault matrix {'PASSED' if figures['passed'] else 'FAILED'}")
