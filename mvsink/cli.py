"""The `mvsink` command line.

    mvsink stack up|down|status|env   the embedded Kafka + MinIO on loopback
    mvsink shard show|snapshot|compact|sweep   inspect and maintain a shard
    mvsink bench [--quick] [--out D]  mvsink vs Structured Streaming peer vs raw limit
    mvsink bench shard|pipeline       shard library vs raw S3; pipeline updates/s, freshness
    mvsink bench restart|readonly     resume over a shard equal to desired; read-only state size
    mvsink bench soak [--ticks N]     many ticks: state, parts, bucket, latencies stay flat
    mvsink desired send|advance       publish desired updates and progress (upstream side)
    mvsink promote SINK               switch a read-only sink replica to writing
    mvsink sink show SINK             each desired partition: log start, checkpoint, hold
    mvsink sink release SINK --yes    drop a dropped sink's holds on the shard's since
    mvsink repair SINK [--yes]        re-seed checkpoints whose desired records were deleted
    mvsink inspect TOPIC [-f]         decode and print any of mvsink's topics
    mvsink provision                  create the configured sink's topics, bucket, shard
    mvsink demo                       stack up, then the whole pipeline on a demo view
    mvsink smoke                      stack up, one record of each contract, conditional writes
    mvsink view                       the demo's view job alone (the upstream of a deployment)

Every command reads the configuration of `mvsink.io.config` (`--config FILE`, `MVSINK_*`, and the
running embedded stack). Errors are printed as one clear line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from mvsink.bench import FAULTS
from mvsink.core.errors import MvsinkError
from mvsink.core.frontier import Frontier
from mvsink.io.config import Config, Topics, cache_dir, load_config, state_dir
from mvsink.io.service import run_command
from mvsink.stack.manager import Stack
from mvsink.stack.state import stack_home

if TYPE_CHECKING:
    from mvsink.shard import Shard
    from mvsink.upstream.producer import DesiredProducer


def say(message: str) -> None:
    """Progress output: stderr, flushed, timestamped."""
    # One write per line, so lines from parallel steps (builds) never interleave.
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def _stack() -> Stack:
    return Stack(stack_home(state_dir()), cache_dir(), say)


def cmd_stack_up(args: argparse.Namespace) -> int:
    if args.spark_workers is not None and args.spark_workers < 0:
        raise MvsinkError(f"--spark-workers must be >= 0, not {args.spark_workers}")
    endpoints = _stack().up(
        timeout=args.timeout, spark_workers=args.spark_workers, spark_cores=args.spark_cores
    )
    if not args.no_provision:
        _provision(load_config(args.config))
    cmd_stack_status(args)
    print(
        f"\nkafka bootstrap: {endpoints.kafka_bootstrap}\ns3 endpoint:     http://{endpoints.s3_endpoint}"
    )
    return 0


def cmd_stack_down(args: argparse.Namespace) -> int:
    stopped = _stack().down()
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


def cmd_stack_status(args: argparse.Namespace) -> int:
    rows = _stack().status()
    print(f"{'component':<14} {'state':<14} {'address':<24} {'pid':>8}  log")
    for row in rows:
        pid = str(row.pid) if row.pid else "-"
        print(f"{row.name:<14} {row.state:<14} {row.address:<24} {pid:>8}  {row.log}")
    if not any(r.name == "spark-master" and r.state == "running" for r in rows):
        print(f"{'spark':<14} {'in-process':<14} {'local[*] (default)':<24} {'-':>8}  -")
    return 0


def cmd_stack_env(args: argparse.Namespace) -> int:
    home = stack_home(state_dir())
    rows = {row.name: row for row in _stack().status()}
    if any(rows[n].state != "running" for n in ("kafka", "minio")):
        raise MvsinkError("the embedded stack is not running: run `mvsink stack up` first")
    print(f"export MVSINK_KAFKA_BOOTSTRAP={rows['kafka'].address}")
    print(f"export MVSINK_S3_ENDPOINT={rows['minio'].address}")
    print(f"export MVSINK_S3_ACCESS_KEY_FILE={home / 'credentials' / 's3-access-key'}")
    print(f"export MVSINK_S3_SECRET_KEY_FILE={home / 'credentials' / 's3-secret-key'}")
    master = rows.get("spark-master")
    if master is not None and master.state == "running":
        print(f"export MVSINK_SPARK_MASTER={master.address}")
    return 0


def _provision(config: Config) -> None:
    from mvsink.tools.provision import provision

    result = provision(config)
    created = ", ".join(result.topics_created) or "none (all existed)"
    shard = (
        ""
        if result.shard_upper is None
        else f"; shard {config.shard_id} upper {result.shard_upper}"
    )
    say(
        f"sink {config.sink_id}: topics created: {created}; "
        f"bucket {config.s3.bucket}: {'created' if result.bucket_created else 'exists'}{shard}"
    )


def cmd_provision(args: argparse.Namespace) -> int:
    _provision(load_config(args.config))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from mvsink.tools.demo import run_demo

    # run_demo provisions a sink of its own: the configured one is left alone.
    return _demo(args, run_demo)


def _demo(args: argparse.Namespace, run: Callable[..., None]) -> int:
    """Bring the stack up unless `--no-stack`, then run a demo with `--ticks` and `--orders`."""
    if not args.no_stack:
        _stack().up(timeout=args.timeout)
    run(load_config(args.config), say, ticks=args.ticks, orders=args.orders)
    return 0


def cmd_ct_run(args: argparse.Namespace) -> int:
    from mvsink.io.ct_definition import load_definition

    load_definition(args.task)  # a bad definition fails here, before Spark starts
    env = {**os.environ, "MVSINK_CT_TASK": str(Path(args.task).resolve())}
    if args.config:
        env["MVSINK_CONFIG"] = args.config
    # The continual task service is its own process, as deployed (`python -m services.ct`).
    os.execve(sys.executable, [sys.executable, "-m", "services.ct"], env)


def cmd_ct_show(args: argparse.Namespace) -> int:
    from mvsink.core.frontier import meet_all
    from mvsink.io.ct_definition import load_definition
    from mvsink.shard import open_shard

    definition = load_definition(args.task)
    s3 = load_config(args.config).s3
    reads = {name: open_shard(shard_id, None, s3) for name, shard_id in definition.shards().items()}
    try:
        output = open_shard(definition.output_shard, None, s3)
    except MvsinkError:
        output = None
    read = {name: shard.state() for name, shard in reads.items()}
    progress = meet_all([read[name].upper for name in definition.inputs])
    rows = [
        (
            "task",
            f"{definition.name}  (as_of {definition.as_of}"
            f"{', snapshot' if definition.snapshot else ''})",
        )
    ]
    for name, state in read.items():
        kind = "input" if name in definition.inputs else "reference"
        lease = state.lease(f"ct.{definition.name}")
        held = f"held at {lease.since}" if lease else "no lease"
        rows.append(
            (kind, f"{name} = {state.shard_id}: upper {state.upper}, since {state.since} ({held})")
        )
    if output is None:
        rows.append(
            (
                "output",
                f"{definition.output_name} = {definition.output_shard}: "
                "not created yet (the task has not run)",
            )
        )
    else:
        state = output.state()
        lag = "caught up" if state.upper == progress else f"inputs at {progress}"
        rows.append(
            (
                "output",
                f"{definition.output_name} = {output.shard_id}: upper "
                f"{state.upper} ({lag}), {len(state.batches)} batches",
            )
        )
    for number, statement in enumerate(definition.logic, 1):
        rows.append((f"logic {number}", statement.text))
    for name, value in rows:
        print(f"{name:<10} {value}")
    if output is not None:
        table = output.snapshot(output.upper())
        print(
            f"\n{table.num_rows} rows as of {output.upper()}"
            + (f", the first {args.limit}:" if table.num_rows > args.limit else ":")
        )
        for row in table.slice(0, args.limit).select(output.schema.names).to_pylist():
            print("  " + ", ".join(f"{k}={v}" for k, v in row.items()))
    return 0


def cmd_ct_demo(args: argparse.Namespace) -> int:
    from mvsink.tools.ct_demo import run_ct_demo

    return _demo(args, run_ct_demo)


def cmd_view(args: argparse.Namespace) -> int:
    from mvsink.io.service import Stopping, quiet_retries
    from mvsink.tools.demo import run_view

    quiet_retries()
    stopping = Stopping()
    stopping.install()
    config = load_config(args.config)
    ticks = run_view(config, say, args.ticks, args.orders, args.interval, lambda: stopping.stopped)
    say(f"view stopped after {ticks} ticks")
    return 0


def cmd_smoke(args: argparse.Namespace) -> int:
    from mvsink.tools.smoke import run_smoke

    _stack().up(timeout=args.timeout)
    config = load_config(args.config)
    # A sink of its own, so the smoke records never reach a real sink's `descs`/`batches`.
    smoke_id = f"{config.sink_id}-smoke"
    smoke = replace(
        config,
        sink_id=smoke_id,
        shard_id=smoke_id,
        row_schema="",
        topics=Topics.for_sink(smoke_id, config.topics.frontiers),
    )
    _provision(smoke)
    run_smoke(smoke, say)
    return 0


def _open_shard(args: argparse.Namespace) -> Shard:
    from mvsink.shard import open_shard

    config = load_config(args.config)
    return open_shard(args.shard or config.shard_id, None, config.s3, config.shard_timing())


def cmd_shard_show(args: argparse.Namespace) -> int:
    import time

    from mvsink.shard.compact import shard_table_bytes

    shard = _open_shard(args)
    state = shard.state()
    retained = shard.retained_seqnos()
    writers = Counter(p.writer_id for p in state.parts())
    schema = ", ".join(f"{f.name} {f.type}" for f in state.schema)
    by_writer = ", ".join(f"{w} {n}" for w, n in sorted(writers.items())) or "-"
    objects, in_bucket = shard_table_bytes(shard)
    now = time.time()
    leases = (
        ", ".join(
            f"{r.reader_id} at {r.since} ({r.expires_at - now:.0f}s left)" for r in state.readers
        )
        or "-"
    )
    retain = "all history" if state.retain_history is None else f"{state.retain_history} times"
    sizes = ", ".join(f"{b.updates:,}" for b in state.batches) or "-"
    rows = [
        ("shard", f"{shard.shard_id}  (bucket {shard.bucket})"),
        (
            "seqno",
            f"{state.seqno}  (retained versions {retained[0]}..{retained[-1]}: "
            f"{len(retained)}; this one {len(state.to_bytes()):,} bytes, {state.change})",
        ),
        ("upper", str(state.upper)),
        ("since", f"{state.since}  (retain {retain}; leases: {leases})"),
        ("holds", ", ".join(f"{h.holder_id} at {h.since}" for h in state.holds) or "-"),
        ("schema", schema),
        ("batches", f"{len(state.batches)} live  (updates each, oldest first: {sizes})"),
        ("parts", f"{len(state.parts())} live  (by writer: {by_writer})"),
        ("updates", f"{state.total_updates():,} live"),
        (
            "bytes",
            f"{state.total_bytes():,} live; {in_bucket:,} in the bucket under the shard "
            f"({objects} objects: live parts, retained versions, garbage not yet collected)",
        ),
    ]
    for name, value in rows:
        print(f"{name:<8} {value}")
    return 0


def cmd_shard_compact(args: argparse.Namespace) -> int:
    from mvsink.shard import Merged
    from mvsink.shard.compact import Runner, compact_once, run_locally, spark_runner

    config = load_config(args.config)
    shard = _open_shard(args)
    runner: Runner = run_locally
    if args.spark:
        from mvsink.io.spark import spark_session

        runner = spark_runner(spark_session("mvsink-compact", config.spark_master))
    merges = 0
    while merges < args.max_merges:
        outcome = compact_once(
            shard,
            config.compaction_policy(),
            f"compact-{os.getpid()}",
            runner,
            force=args.all and merges == 0,
        )
        if outcome is None:
            break
        merges += 1
        request = outcome.request
        verdict = "merged" if isinstance(outcome.result, Merged) else "refused (inputs gone)"
        say(
            f"{verdict}: {len(request.inputs)} batches [{request.lower}, {request.upper}) at "
            f"since {request.since} ({request.reason}): {request.updates:,} -> "
            f"{outcome.updates_out:,} updates, {outcome.bytes_in:,} -> {outcome.bytes_out:,} "
            f"bytes in {outcome.seconds:.2f}s"
        )
    collected = shard.collect_garbage()
    say(
        f"{merges} merges; {len(shard.state().batches)} live batches; garbage collected: "
        f"{len(collected.parts_deleted)} replaced parts, {len(collected.states_pruned)} versions "
        f"(replaced parts live {shard.timing.part_grace:.0f}s more: run again to delete them)"
    )
    return 0


def cmd_shard_snapshot(args: argparse.Namespace) -> int:
    import pyarrow.csv as pacsv

    shard = _open_shard(args)
    as_of = args.as_of if args.as_of is not None else shard.upper().time
    if as_of is None:
        raise MvsinkError("the shard is closed (upper {}): pass --as-of")
    table = shard.snapshot(as_of)
    table = table.sort_by([(name, "ascending") for name in shard.schema.names])
    say(f"shard {shard.shard_id} at as_of {{{as_of}}}: {table.num_rows} distinct rows")
    shown = table.slice(0, args.limit) if args.limit else table
    if args.format == "csv":
        pacsv.write_csv(shown, sys.stdout.buffer)
    else:
        for row in shown.to_pylist():
            print(json.dumps(row, default=str))
    return 0


def cmd_shard_sweep(args: argparse.Namespace) -> int:
    shard = _open_shard(args)
    result = shard.sweep(grace=args.grace)
    print(f"parts deleted:     {len(result.parts_deleted)}")
    for key in result.parts_deleted:
        print(f"  {key}")
    print(f"parts referenced:  {result.parts_referenced}")
    print(f"parts within grace:{result.parts_kept_young:>3}")
    print(f"states pruned:     {len(result.states_pruned)}")
    return 0


def cmd_bench_shard(args: argparse.Namespace) -> int:
    from mvsink.bench.shard import run

    if not args.no_stack:
        _stack().up()
    run(load_config(args.config), args.rows, args.parts, args.appends, say)
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    from confluent_kafka import Producer

    from mvsink.core.messages import SinkControl
    from mvsink.io.kafka import client_config, produce

    config = load_config(args.config)
    topic = Topics.for_sink(args.sink).control
    producer = Producer(client_config(config.kafka_bootstrap))
    produce(producer, topic, args.sink, SinkControl(read_only=False))
    if producer.flush(30):
        raise MvsinkError(f"could not deliver the promotion to {topic}")
    say(f"sink {args.sink} promoted: SinkControl(read_only=false) on {topic}")
    return 0


def _write_tool(args: argparse.Namespace, *argv: str) -> int:
    """Run the write service's operator tool (`python -m services.write.repair`) on this sink:
    the checkpoints are the write service's own, so the tool that reads and re-seeds them ships
    with it, and the library only starts it."""
    env = dict(os.environ)
    if args.config:
        env["MVSINK_CONFIG"] = args.config
    shard = ["--shard", args.shard] if args.shard else []
    command = [sys.executable, "-m", "services.write.repair", *argv, args.sink, *shard]
    return subprocess.call(command, env=env)


def cmd_sink_show(args: argparse.Namespace) -> int:
    return _write_tool(args, "show")


def cmd_sink_release(args: argparse.Namespace) -> int:
    from mvsink.shard import open_shard

    config = load_config(args.config)
    shard = open_shard(args.shard or config.shard_id, None, config.s3, config.shard_timing())
    prefix = f"checkpoint:{args.sink}:"
    held = [h for h in shard.state().holds if h.holder_id.startswith(prefix)]
    if not held:
        say(f"shard {shard.shard_id} holds nothing for sink {args.sink}")
        return 0
    for hold in held:
        say(f"{hold.holder_id} holds since at {hold.since}")
    if not args.yes:
        raise MvsinkError(
            "releasing them lets since pass the sink's checkpoints (a dropped "
            "sink's are no longer needed): run it again with --yes"
        )
    state = shard.release_holds(h.holder_id for h in held)
    say(f"released {len(held)} holds of sink {args.sink}; since is now {state.since}")
    return 0


def cmd_repair(args: argparse.Namespace) -> int:
    partitions = [f"--partition={p}" for p in args.partition or []]
    return _write_tool(args, "repair", *partitions, *(["--yes"] if args.yes else []))


def cmd_inspect(args: argparse.Namespace) -> int:
    from mvsink.tools.inspect import inspect_topic

    config = load_config(args.config)
    inspect_topic(config.kafka_bootstrap, args.topic, follow=args.follow, limit=args.limit)
    return 0


def _desired_producer(args: argparse.Namespace) -> DesiredProducer:
    from mvsink.core.rows import parse_row_schema
    from mvsink.shard import open_shard
    from mvsink.upstream.producer import DesiredProducer

    config = load_config(args.config)
    schema = (
        parse_row_schema(config.row_schema)
        if config.row_schema
        else open_shard(config.shard_id, None, config.s3).schema
    )
    producer = DesiredProducer(config, schema, args.producer_id or f"cli.{config.sink_id}")
    producer.start()
    return producer


def cmd_desired_send(args: argparse.Namespace) -> int:
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    path = Path(args.file)
    table = pq.read_table(path) if path.suffix == ".parquet" else pacsv.read_csv(path)
    producer = _desired_producer(args)
    sent = producer.send(table)
    if args.advance_to is not None:
        producer.advance_to(Frontier.at(args.advance_to))
    else:
        producer.advance_to(producer.frontier)  # commit at the unchanged frontier
    say(f"sent {sent} updates to {producer.config.topics.desired}; frontier {producer.frontier}")
    return 0


def cmd_desired_advance(args: argparse.Namespace) -> int:
    producer = _desired_producer(args)
    producer.advance_to(Frontier.at(args.to))
    say(f"sink {producer.config.sink_id}: desired frontier {producer.frontier}")
    return 0


def cmd_bench_pipeline(args: argparse.Namespace) -> int:
    from mvsink.bench.pipeline import run

    if not args.no_stack:
        _stack().up()
    figures = run(
        load_config(args.config), args.seconds, args.keys, args.change, say, args.interval
    )
    return 0 if figures["converged"] else 1


def cmd_bench_compare(args: argparse.Namespace) -> int:
    from mvsink.bench.compare import SYSTEMS, run
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
        _stack().up()
    keys, ticks = (
        (args.keys or 100_000, args.ticks or 6)
        if args.quick
        else (args.keys or 1_000_000, args.ticks or 20)
    )
    systems = tuple(s.strip() for s in args.systems.split(",")) if args.systems else SYSTEMS
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        say(f"unknown system(s) {sorted(unknown)}: choose from {', '.join(SYSTEMS)}")
        return 2
    workload = Workload(keys, args.change, ticks, args.partitions)
    stack = _stack()
    try:
        figures = run(
            load_config(args.config),
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
        )
    finally:
        if spark_workers:
            stack.spark_up(0)
    correct = [v for k, v in figures.items() if k.endswith("shard_equals_desired")]
    return 0 if all(v in (True, None) for v in correct) else 1


def cmd_bench_restart(args: argparse.Namespace) -> int:
    from mvsink.bench.steady import run_restart

    if not args.no_stack:
        _stack().up()
    figures = run_restart(
        load_config(args.config), args.updates, args.partitions, Path(args.out), say
    )
    return 0 if figures["cold_bytes_rewritten"] == 0 and figures["warm_bytes_rewritten"] == 0 else 1


def cmd_bench_soak(args: argparse.Namespace) -> int:
    from mvsink.bench.soak import run_soak
    from mvsink.bench.workload import Workload

    if not args.no_stack:
        _stack().up()
    workload = Workload(args.keys, args.change, args.ticks, args.partitions)
    figures = run_soak(
        load_config(args.config), workload, args.early, args.window, Path(args.out), say
    )
    return 0 if figures["correct"] and figures["measured"] else 1


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
    )
    return 0 if figures["passed"] else 1


def cmd_compose_verify(args: argparse.Namespace) -> int:
    from mvsink.tools.compose.verify import run_verify

    figures = run_verify(
        state_dir() / "compose", cache_dir(), say, keep=args.keep, timeout=args.timeout
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compose.json").write_text(json.dumps(figures, indent=2, default=str))
    return 0


def cmd_bench_readonly(args: argparse.Namespace) -> int:
    from mvsink.bench.steady import run_readonly

    if not args.no_stack:
        _stack().up()
    run_readonly(
        load_config(args.config),
        args.keys,
        args.change,
        args.minutes,
        args.interval,
        args.partitions,
        Path(args.out),
        say,
    )
    return 0


def _demo_arguments(
    parser: argparse.ArgumentParser,
    func: Callable[[argparse.Namespace], int],
    ticks: int,
    orders: int,
    orders_help: str,
) -> None:
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--ticks", type=int, default=ticks, help="ticks of order events")
    parser.add_argument("--orders", type=int, default=orders, help=orders_help)
    parser.add_argument("--no-stack", action="store_true", help="use configured endpoints")
    parser.set_defaults(func=func)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used by tests to check compose commands are real)."""
    parser = argparse.ArgumentParser(prog="mvsink", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="TOML config file (default: $MVSINK_CONFIG)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    stack = commands.add_parser("stack", help="embedded Kafka + MinIO on loopback")
    stack_commands = stack.add_subparsers(dest="stack_command", required=True, metavar="ACTION")
    up = stack_commands.add_parser("up", help="build what is missing, start, provision")
    up.add_argument("--timeout", type=float, default=180.0, help="seconds to wait per component")
    up.add_argument("--no-provision", action="store_true", help="do not create sink topics")
    up.add_argument(
        "--spark-workers",
        type=int,
        metavar="N",
        help="also run a Spark standalone master with N workers (0 stops it; another N scales it)",
    )
    up.add_argument(
        "--spark-cores", type=int, default=1, metavar="C", help="cores per Spark worker (default 1)"
    )
    up.set_defaults(func=cmd_stack_up)
    stack_commands.add_parser("down", help="stop what `up` started").set_defaults(
        func=cmd_stack_down
    )
    stack_commands.add_parser("status", help="components, addresses, pids").set_defaults(
        func=cmd_stack_status
    )
    stack_commands.add_parser("env", help="print MVSINK_* exports for the stack").set_defaults(
        func=cmd_stack_env
    )

    shard = commands.add_parser("shard", help="inspect and maintain a shard")
    shard.add_argument("--shard", help="shard id (default: the configured one)")
    shard_commands = shard.add_subparsers(dest="shard_command", required=True, metavar="ACTION")
    shard_commands.add_parser(
        "show", help="upper, since, leases, live batches/parts, bytes live vs in the bucket"
    ).set_defaults(func=cmd_shard_show)
    compact = shard_commands.add_parser(
        "compact",
        help="merge live batches now (as the policy asks, or --all), then collect garbage",
    )
    compact.add_argument("--all", action="store_true", help="first merge every live batch")
    compact.add_argument("--spark", action="store_true", help="run the merges on Spark executors")
    compact.add_argument("--max-merges", type=int, default=100)
    compact.set_defaults(func=cmd_shard_compact)
    snapshot = shard_commands.add_parser("snapshot", help="consolidated contents at --as-of")
    snapshot.add_argument("--as-of", type=int, help="frontier (default: the upper)")
    snapshot.add_argument("--limit", type=int, default=0, help="print at most N rows")
    snapshot.add_argument("--format", choices=["jsonl", "csv"], default="jsonl")
    snapshot.set_defaults(func=cmd_shard_snapshot)
    sweep = shard_commands.add_parser("sweep", help="delete leaked parts, prune old versions")
    sweep.add_argument("--grace", type=float, required=True, help="seconds (>= the minimum)")
    sweep.set_defaults(func=cmd_shard_sweep)

    bench = commands.add_parser(
        "bench",
        help="benchmarks against same-run baselines",
        description="Without WHAT: mvsink vs the Structured Streaming peer vs the raw limit on "
        "one workload (see mvsink.bench.compare); WHAT runs a narrower benchmark.",
    )
    bench.add_argument("--quick", action="store_true", help="100k keys, 6 ticks (< 5 min)")
    bench.add_argument("--out", default="bench-out", help="directory for bench.json, bench.png")
    bench.add_argument("--keys", type=int, default=0, help="view size (default 1M, quick 100k)")
    bench.add_argument("--ticks", type=int, default=0, help="ticks after the load (20, quick 6)")
    bench.add_argument("--change", type=float, default=0.1, help="share of keys changed per tick")
    bench.add_argument("--partitions", type=int, default=4, help="P (desired partitions)")
    bench.add_argument("--append-workers", type=int, default=2, help="A (append workers)")
    bench.add_argument("--in-flight", type=int, default=2, help="ticks published, not durable")
    bench.add_argument(
        "--systems",
        default="",
        help="comma list of mvsink,peer,delta,raw,mvsink-e2e,peer-e2e (default all)",
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
    faults.add_argument("--out", default="bench-out", help="directory for faults.json")
    faults.set_defaults(func=cmd_bench_faults)
    restart = bench_commands.add_parser("restart", help="resume time over a shard equal to desired")
    restart.add_argument("--updates", type=int, default=10_000_000, help="updates in the shard")
    readonly = bench_commands.add_parser("readonly", help="correction state of a read-only replica")
    readonly.add_argument("--minutes", type=float, default=10.0)
    readonly.add_argument("--keys", type=int, default=100_000)
    readonly.add_argument("--change", type=float, default=0.1, help="share changed per tick")
    readonly.add_argument("--interval", type=float, default=1.0, help="seconds between ticks")
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
    for sub, func in (
        (restart, cmd_bench_restart),
        (readonly, cmd_bench_readonly),
        (soak, cmd_bench_soak),
    ):
        sub.add_argument("--partitions", type=int, default=4, help="P (desired partitions)")
        sub.add_argument("--out", default="bench-out", help="directory for the JSON figures")
        sub.add_argument("--no-stack", action="store_true", help="use configured endpoints")
        sub.set_defaults(func=func)

    compose = commands.add_parser("compose", help="the docker compose deployment")
    compose_commands = compose.add_subparsers(
        dest="compose_command", required=True, metavar="ACTION"
    )
    verify = compose_commands.add_parser(
        "verify", help="engine, images, up scaled, kill and restart, converge, down (README)"
    )
    verify.add_argument("--keep", action="store_true", help="leave the project running")
    verify.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to wait for each convergence"
    )
    verify.add_argument("--out", default="bench-out", help="directory for compose.json")
    verify.set_defaults(func=cmd_compose_verify)

    desired = commands.add_parser("desired", help="publish desired updates and progress")
    desired.add_argument("--producer-id", help="transactional id (default cli.<sink>)")
    desired_commands = desired.add_subparsers(
        dest="desired_command", required=True, metavar="ACTION"
    )
    send = desired_commands.add_parser("send", help="send (row..., _time, _diff) from a file")
    send.add_argument("file", help=".parquet or .csv with the row columns, _time, _diff[, _err]")
    send.add_argument("--advance-to", type=int, help="then advance the frontier to this time")
    send.set_defaults(func=cmd_desired_send)
    advance_cmd = desired_commands.add_parser("advance", help="advance the desired frontier")
    advance_cmd.add_argument("--to", type=int, required=True)
    advance_cmd.set_defaults(func=cmd_desired_advance)

    promote = commands.add_parser("promote", help="switch a read-only sink to writing")
    promote.add_argument("sink", help="sink id")
    promote.set_defaults(func=cmd_promote)
    sink = commands.add_parser("sink", help="a sink replica's desired partitions")
    sink.add_argument("--shard", default="", help="shard id (default: the configured one)")
    sink_commands = sink.add_subparsers(dest="sink_command", required=True, metavar="ACTION")
    sink_show = sink_commands.add_parser(
        "show", help="each desired partition: log start, end, checkpoint, hold, repair needed"
    )
    sink_show.add_argument("sink", help="sink id")
    sink_show.set_defaults(func=cmd_sink_show)
    sink_release = sink_commands.add_parser(
        "release", help="drop a dropped sink's holds on the shard's since (its checkpoints')"
    )
    sink_release.add_argument("sink", help="sink id")
    sink_release.add_argument("--yes", action="store_true", help="release, not only list")
    sink_release.set_defaults(func=cmd_sink_release)
    repair = commands.add_parser(
        "repair", help="re-seed checkpoints whose desired records were deleted, from the shard"
    )
    repair.add_argument("sink", help="sink id")
    repair.add_argument("--shard", default="", help="shard id (default: the configured one)")
    repair.add_argument(
        "--partition",
        type=int,
        action="append",
        help="re-seed this partition (repeatable; default: those that need it)",
    )
    repair.add_argument("--yes", action="store_true", help="do not ask before acting")
    repair.set_defaults(func=cmd_repair)
    inspect = commands.add_parser("inspect", help="decode and print any mvsink topic")
    inspect.add_argument("topic")
    inspect.add_argument("--follow", "-f", action="store_true", help="keep printing new records")
    inspect.add_argument("--limit", type=int, default=0, help="stop after N records")
    inspect.set_defaults(func=cmd_inspect)

    commands.add_parser("provision", help="create the sink's topics and bucket").set_defaults(
        func=cmd_provision
    )
    demo = commands.add_parser("demo", help="stack up + the whole pipeline on a demo view")
    _demo_arguments(demo, cmd_demo, ticks=8, orders=200, orders_help="order events per tick")
    view = commands.add_parser("view", help="the demo's view job alone, for the configured sink")
    view.add_argument("--ticks", type=int, default=0, help="0 = until SIGTERM")
    view.add_argument("--orders", type=int, default=200, help="order events per tick")
    view.add_argument("--interval", type=float, default=1.0, help="seconds per tick")
    view.set_defaults(func=cmd_view)
    ct = commands.add_parser("ct", help="continual tasks (examples/ct/*.toml)")
    ct_commands = ct.add_subparsers(dest="ct_command", required=True, metavar="ACTION")
    ct_run = ct_commands.add_parser(
        "run", help="run one task in the foreground (python -m services.ct)"
    )
    ct_run.add_argument("task", help="the task's definition file (TOML)")
    ct_run.set_defaults(func=cmd_ct_run)
    ct_show = ct_commands.add_parser("show", help="a task's inputs, output, lag and contents")
    ct_show.add_argument("task", help="the task's definition file (TOML)")
    ct_show.add_argument("--limit", type=int, default=10, help="rows of the output to print")
    ct_show.set_defaults(func=cmd_ct_show)
    ct_demo = ct_commands.add_parser("demo", help="stack up + three tasks over demo orders")
    _demo_arguments(
        ct_demo, cmd_ct_demo, ticks=12, orders=20, orders_help="at most this many orders a tick"
    )
    smoke = commands.add_parser("smoke", help="stack up + one record of each contract + CAS")
    smoke.add_argument("--timeout", type=float, default=180.0)
    smoke.set_defaults(func=cmd_smoke)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `mvsink` console script."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return run_command(lambda: func(args))


if __name__ == "__main__":
    sys.exit(main())
