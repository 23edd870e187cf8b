"""`mvsink bench [WHAT]`: benchmarks that print measured figures next to same-run baselines.

Without WHAT: mvsink vs the Structured Streaming peer vs the raw limit on one workload
(`mvsink.bench.compare`); WHAT runs a narrower benchmark (`shard`, `pipeline`, `faults`,
`restart`, `readonly`, `soak`, `views`). Each exits 1 when its figures show a wrong result.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from mvsink.bench import FAULTS, FAULTS_MIN_GRACE, require_extra
from mvsink.cli.common import embedded_stack
from mvsink.core.errors import ConfigError, MvsinkError
from mvsink.io.service import say
from mvsink.stack.state import stack_config

if TYPE_CHECKING:
    from mvsink.cli.common import Commands
    from mvsink.stack.manager import Stack

#: The full bench's steady window per system, its sustained window (at a deeper closed loop),
#: and the ticks encoded for both: the raw loop, the fastest system, takes up to ~2.2M updates/s
#: at the default depth here and ~3.2M at the sustained one, 11 and 16 ticks a second of a
#: 1M-key view.
FULL_SECONDS = 30.0
FULL_SUSTAINED_SECONDS = 20.0
FULL_TICKS = 800
#: At most this many ticks in flight in the sustained window: one mvsink description can
#: cover several ticks, as a peer's micro-batch can (`mvsink.bench.compare` module docs).
SUSTAINED_IN_FLIGHT = 8
#: The full bench's broker warm-up: mvsink's first minute on a broker just started is when its
#: Kafka CPU falls to a warm broker's (`mvsink.bench.compare` module docs).
FULL_WARM_UP = 60.0
#: Held by the benchmark running on this machine, whichever clone or state directory it runs
#: from (`flock`: freed when its process ends, however it ends).
BENCH_LOCK = Path(tempfile.gettempdir()) / "mvsink-bench.lock"


@contextlib.contextmanager
def alone(lock: Path = BENCH_LOCK) -> Iterator[None]:
    """Hold `lock` for a benchmark, or raise `MvsinkError` naming the benchmark that holds it:
    two benchmarks on one machine share its cores, and each would measure both."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o666)  # another user's benchmark may take it next
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
            raise MvsinkError(
                f"another benchmark is running on this machine ({holder}): figures taken "
                "beside it would measure both; wait for it to end, or stop it"
            ) from None
        os.ftruncate(fd, 0)
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        os.pwrite(fd, f"pid {os.getpid()} since {started}: {shlex.join(sys.argv)}".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _alone(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """`func` run under `alone`, once the bench extra is known to be installed."""

    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        require_extra()
        with alone():
            return func(args)

    return run


def add_bench(commands: Commands) -> None:
    """`mvsink bench` and its narrower benchmarks."""
    bench = commands.add_parser(
        "bench",
        help="benchmarks against same-run baselines",
        description="Without WHAT: mvsink vs the Structured Streaming peer vs the raw limit on "
        "one workload (see mvsink.bench.compare); WHAT runs a narrower benchmark.",
    )
    bench.add_argument(
        "--quick", action="store_true", help="100k keys, 6 ticks, one repeat (< 5 min)"
    )
    bench.add_argument("--out", default="bench-out", help="directory for bench.json, bench.png")
    bench.add_argument("--keys", type=int, default=0, help="view size (default 1M, quick 100k)")
    bench.add_argument(
        "--ticks",
        type=int,
        default=0,
        help=f"ticks encoded after the load (default {FULL_TICKS}: enough for a {FULL_SECONDS:g}s "
        "window of the fastest system here; quick 6)",
    )
    bench.add_argument(
        "--repeats",
        type=int,
        default=0,
        help="interleaved repeats of all systems (default 3, quick 1); figures are the median "
        "[min-max] over them",
    )
    bench.add_argument(
        "--seconds",
        type=float,
        default=None,
        help=f"each system's steady window: no tick is published after it (default "
        f"{FULL_SECONDS:g}; quick: every tick; 0: every tick)",
    )
    bench.add_argument(
        "--warm-up",
        type=float,
        default=None,
        help=f"seconds of mvsink's ticks, untimed, before the first repeat, so that no system "
        f"is measured on a broker just started (default {FULL_WARM_UP:g}; quick 0)",
    )
    bench.add_argument("--change", type=float, default=0.1, help="share of keys changed per tick")
    bench.add_argument("--partitions", type=int, default=4, help="P (desired partitions)")
    bench.add_argument("--append-workers", type=int, default=2, help="A (append workers)")
    bench.add_argument("--in-flight", type=int, default=2, help="ticks published, not durable")
    bench.add_argument(
        "--sustained-seconds",
        type=float,
        default=None,
        help=f"each system's sustained window, after its steady one, fed at "
        f"--sustained-in-flight (default {FULL_SUSTAINED_SECONDS:g}; quick and 0: none)",
    )
    bench.add_argument(
        "--sustained-in-flight",
        type=int,
        default=SUSTAINED_IN_FLIGHT,
        help="ticks published, not durable, in the sustained window",
    )
    bench.add_argument(
        "--systems",
        default="",
        help="comma list of mvsink,peer,delta,raw,mvsink-e2e,peer-e2e (default all), and "
        "mvsink-registry (mvsink on the Schema Registry's wire format; the embedded stack's "
        "registry, or [kafka] schema_registry_url with --no-stack)",
    )
    bench.add_argument(
        "--wire",
        choices=("arrow", "avro"),
        default="arrow",
        help="desired records: v2 UpdatesArrow (default) or v1 Avro rows",
    )
    bench.add_argument("--spark-master", help="mvsink's write service runs on this Spark master")
    bench.add_argument(
        "--spark-workers",
        metavar="N,N,...",
        help="mvsink once per size of the embedded Spark cluster, e.g. 0,1,2 "
        "(0: local[*]), side by side",
    )
    bench.add_argument("--no-stack", action="store_true", help="use configured endpoints")
    bench.add_argument(
        "--keep-data",
        action="store_true",
        help="keep each column's topics and objects (default: deleted once its figures are taken)",
    )
    bench.set_defaults(func=cmd_bench_compare)
    bench_commands = bench.add_subparsers(dest="bench_command", required=False, metavar="WHAT")
    bench_shard = bench_commands.add_parser("shard", help="shard library vs raw S3 calls")
    bench_shard.add_argument("--rows", type=int, default=1_000_000)
    bench_shard.add_argument("--parts", type=int, default=8)
    bench_shard.add_argument("--appends", type=int, default=200)
    bench_shard.add_argument("--no-stack", action="store_true", help="use configured endpoints")
    bench_shard.set_defaults(func=cmd_bench_shard)
    bench_pipeline = bench_commands.add_parser("pipeline", help="updates/s and freshness")
    bench_pipeline.add_argument("--seconds", type=float, default=30.0)
    bench_pipeline.add_argument("--keys", type=int, default=10_000)
    bench_pipeline.add_argument("--change", type=float, default=0.1, help="share changed per tick")
    bench_pipeline.add_argument(
        "--interval",
        type=float,
        default=0.0,
        help="seconds between ticks (0: as fast as the producer can)",
    )
    bench_pipeline.add_argument("--no-stack", action="store_true", help="use configured endpoints")
    bench_pipeline.set_defaults(func=cmd_bench_pipeline)
    faults = bench_commands.add_parser(
        "faults", help="the fault matrix: Kafka, MinIO and each service killed or stalled"
    )
    faults.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help=f"comma-separated, in order (default all: {','.join(FAULTS)})",
    )
    faults.add_argument("--outage", type=float, default=15.0, help="seconds each fault lasts")
    faults.add_argument("--keys", type=int, default=40)
    faults.add_argument("--change", type=int, default=8, help="keys changed per tick")
    faults.add_argument("--interval", type=float, default=1.0, help="seconds between ticks")
    faults.add_argument(
        "--min-grace",
        type=float,
        default=FAULTS_MIN_GRACE,
        help="the shard's min_grace in seconds (max_part_age and reader_lease: two thirds of "
        "it; more than 15); a *-pause fault lasts 2 s past it",
    )
    faults.add_argument("--out", default="bench-out", help="directory for faults.json")
    faults.set_defaults(func=cmd_bench_faults)
    restart = bench_commands.add_parser("restart", help="resume time over a shard equal to desired")
    restart.add_argument("--updates", type=int, default=10_000_000, help="updates in the shard")
    readonly = bench_commands.add_parser("readonly", help="correction state of a read-only replica")
    readonly.add_argument("--minutes", type=float, default=10.0)
    readonly.add_argument("--keys", type=int, default=100_000)
    readonly.add_argument("--change", type=float, default=0.1, help="share changed per tick")
    readonly.add_argument("--interval", type=float, default=1.0, help="seconds between ticks")
    readonly.add_argument(
        "--sample-every", type=float, default=10.0, help="seconds between samples (a tick's)"
    )
    soak = bench_commands.add_parser("soak", help="many ticks: the shard stays small and fast")
    soak.add_argument("--ticks", type=int, default=600, help="ticks after the initial load")
    soak.add_argument("--keys", type=int, default=10_000)
    soak.add_argument("--change", type=float, default=0.1, help="share changed per tick")
    soak.add_argument(
        "--early",
        type=int,
        default=100,
        help="the tick the early window ends at (at most half of --ticks)",
    )
    soak.add_argument("--window", type=int, default=50, help="ticks per window")
    views = bench_commands.add_parser(
        "views", help="many small views on one deployment vs separate deployments"
    )
    views.add_argument(
        "--views", default="1,10", help="comma-separated sink counts of the hosted deployment"
    )
    views.add_argument(
        "--separate", type=int, default=1, help="sinks run as separate deployments (0: none)"
    )
    views.add_argument("--keys", type=int, default=1_000, help="keys per view")
    views.add_argument("--change", type=float, default=0.1, help="share changed per tick")
    views.add_argument("--warmup", type=int, default=10, help="ticks before the window")
    views.add_argument("--seconds", type=int, default=60, help="ticks (one a second) measured")
    views.add_argument("--idle", type=float, default=60.0, help="seconds of the idle phase")
    views.add_argument("--out", default="bench-out", help="directory for views.json")
    views.add_argument("--no-stack", action="store_true", help="use configured endpoints")
    views.set_defaults(func=cmd_bench_views)
    for sub, func in (
        (restart, cmd_bench_restart),
        (readonly, cmd_bench_readonly),
        (soak, cmd_bench_soak),
    ):
        sub.add_argument("--partitions", type=int, default=4, help="P (desired partitions)")
        sub.add_argument("--out", default="bench-out", help="directory for the JSON figures")
        sub.add_argument("--no-stack", action="store_true", help="use configured endpoints")
        sub.set_defaults(func=func)
    # Every benchmark, WHAT or none, runs alone on the machine.
    for parser in (bench, *bench_commands.choices.values()):
        parser.set_defaults(func=_alone(parser.get_default("func")))


def cmd_bench_compare(args: argparse.Namespace) -> int:
    from mvsink.bench.compare import OPTIONAL_SYSTEMS, REGISTRY_FRAMED, SYSTEMS, Sustained, run
    from mvsink.bench.workload import Workload

    spark_workers = (
        tuple(int(n) for n in args.spark_workers.split(",")) if args.spark_workers else ()
    )
    if spark_workers and (args.no_stack or args.spark_master or min(spark_workers) < 0):
        raise MvsinkError(
            "--spark-workers takes sizes >= 0 of the embedded cluster: not with "
            "--no-stack or --spark-master"
        )
    if not args.no_stack:
        embedded_stack().up()
    keys, ticks, repeats, seconds, warm_up, sustained_s = (
        (
            args.keys or 100_000,
            args.ticks or 6,
            args.repeats or 1,
            args.seconds,
            args.warm_up,
            args.sustained_seconds,
        )
        if args.quick
        else (
            args.keys or 1_000_000,
            args.ticks or FULL_TICKS,
            args.repeats or 3,
            FULL_SECONDS if args.seconds is None else args.seconds,
            FULL_WARM_UP if args.warm_up is None else args.warm_up,
            FULL_SUSTAINED_SECONDS if args.sustained_seconds is None else args.sustained_seconds,
        )
    )
    if args.sustained_in_flight < 1:
        say(f"--sustained-in-flight must be at least 1, not {args.sustained_in_flight}")
        return 2
    systems = tuple(s.strip() for s in args.systems.split(",")) if args.systems else SYSTEMS
    known = (*SYSTEMS, *OPTIONAL_SYSTEMS)
    unknown = set(systems) - set(known)
    if unknown:
        say(f"unknown system(s) {sorted(unknown)}: choose from {', '.join(known)}")
        return 2
    workload = Workload(keys, args.change, ticks, args.partitions)
    stack = embedded_stack()
    try:
        figures = run(
            stack_config(args.config),
            workload,
            Path(args.out),
            say,
            args.in_flight,
            systems,
            args.append_workers,
            args.wire,
            args.spark_master,
            spark_workers,
            lambda n: stack.spark_up(n),
            # the embedded stack's registry, started for the column that needs one
            None if args.no_stack or REGISTRY_FRAMED not in systems else stack.registry_up,
            repeats=repeats,
            seconds=seconds or None,
            keep_data=args.keep_data,
            stack=None if args.no_stack else lambda: _running_pids(stack),
            warm_up=warm_up or 0.0,
            sustained=Sustained(args.sustained_in_flight, sustained_s) if sustained_s else None,
        )
    finally:
        if spark_workers:
            stack.spark_up(0)
    correct = [v for k, v in figures.items() if k.endswith("shard_equals_desired")]
    return 0 if all(v in (True, None) for v in correct) else 1


def _running_pids(stack: Stack) -> dict[str, int]:
    """The embedded stack's running components, by name: their pids."""
    return {c.name: c.pid for c in stack.status() if c.state == "running" and c.pid}


def cmd_bench_shard(args: argparse.Namespace) -> int:
    from mvsink.bench.shard import run

    if not args.no_stack:
        embedded_stack().up()
    run(stack_config(args.config), args.rows, args.parts, args.appends, say)
    return 0


def cmd_bench_pipeline(args: argparse.Namespace) -> int:
    from mvsink.bench.pipeline import run

    if not args.no_stack:
        embedded_stack().up()
    figures = run(
        stack_config(args.config), args.seconds, args.keys, args.change, say, args.interval
    )
    return 0 if figures["converged"] else 1


def cmd_bench_faults(args: argparse.Namespace) -> int:
    from mvsink.bench.faults import run_faults

    figures = run_faults(
        args.config,
        [f for f in args.faults.split(",") if f],
        args.outage,
        args.keys,
        args.change,
        args.interval,
        Path(args.out),
        say,
        args.min_grace,
    )
    return 0 if figures["passed"] else 1


def cmd_bench_restart(args: argparse.Namespace) -> int:
    from mvsink.bench.steady import run_restart

    if not args.no_stack:
        embedded_stack().up()
    figures = run_restart(
        stack_config(args.config), args.updates, args.partitions, Path(args.out), say
    )
    return 0 if figures["cold_bytes_rewritten"] == 0 and figures["warm_bytes_rewritten"] == 0 else 1


def cmd_bench_readonly(args: argparse.Namespace) -> int:
    from mvsink.bench.steady import run_readonly

    if not args.no_stack:
        embedded_stack().up()
    run_readonly(
        stack_config(args.config),
        args.keys,
        args.change,
        args.minutes,
        args.interval,
        args.partitions,
        Path(args.out),
        say,
        sample_every=args.sample_every,
    )
    return 0


def cmd_bench_views(args: argparse.Namespace) -> int:
    from mvsink.bench.views import run_views
    from mvsink.bench.workload import Workload

    try:
        counts = [int(n) for n in args.views.split(",") if n.strip()]
    except ValueError:
        raise ConfigError(f"--views {args.views!r}: use comma-separated sink counts") from None
    if not args.no_stack:
        embedded_stack().up()
    workload = Workload(args.keys, args.change, args.warmup + args.seconds, 1)
    figures = run_views(
        stack_config(args.config),
        counts,
        args.separate,
        workload,
        args.warmup,
        args.seconds,
        args.idle,
        Path(args.out),
        say,
    )
    return 0 if figures["correct"] else 1


def cmd_bench_soak(args: argparse.Namespace) -> int:
    from mvsink.bench.soak import run_soak
    from mvsink.bench.workload import Workload

    if not args.no_stack:
        embedded_stack().up()
    workload = Workload(args.keys, args.change, args.ticks, args.partitions)
    figures = run_soak(
        stack_config(args.config), workload, args.early, args.window, Path(args.out), say
    )
    return 0 if figures["correct"] and figures["measured"] else 1
