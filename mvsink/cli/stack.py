"""`mvsink stack`, `compose`, `provision`, `demo`, `view`, `smoke`: running mvsink somewhere.

The embedded stack on loopback, the docker compose deployment, a sink's topics, bucket and shard,
and the demos and smoke test that run on them.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from mvsink.cli.common import demo_arguments, demo_on_stack, embedded_stack
from mvsink.core.errors import MvsinkError
from mvsink.io.config import Config, Topics, cache_dir, state_dir
from mvsink.io.service import say
from mvsink.stack.state import registry_url, stack_config, stack_home

if TYPE_CHECKING:
    from mvsink.cli.common import Commands


def add_stack(commands: Commands) -> None:
    """`mvsink stack up|down|status|env`."""
    stack = commands.add_parser(
        "stack", help="embedded Kafka + MinIO (+ Schema Registry, Spark) on loopback"
    )
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
    up.add_argument(
        "--registry",
        action="store_true",
        help="also run a Confluent-compatible Schema Registry (Apicurio, on the JDK that runs Kafka)",
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


def cmd_stack_up(args: argparse.Namespace) -> int:
    if args.spark_workers is not None and args.spark_workers < 0:
        raise MvsinkError(f"--spark-workers must be >= 0, not {args.spark_workers}")
    endpoints = embedded_stack().up(
        timeout=args.timeout,
        spark_workers=args.spark_workers,
        spark_cores=args.spark_cores,
        schema_registry=args.registry,
    )
    if not args.no_provision:
        provision_sink(stack_config(args.config))
    cmd_stack_status(args)
    print(
        f"\nkafka bootstrap: {endpoints.kafka_bootstrap}\ns3 endpoint:     http://{endpoints.s3_endpoint}"
    )
    if endpoints.schema_registry_url:
        print(f"schema registry: {endpoints.schema_registry_url}")
    return 0


def cmd_stack_down(args: argparse.Namespace) -> int:
    stopped = embedded_stack().down()
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


def cmd_stack_status(args: argparse.Namespace) -> int:
    rows = embedded_stack().status()
    print(f"{'component':<14} {'state':<14} {'address':<24} {'pid':>8}  log")
    for row in rows:
        pid = str(row.pid) if row.pid else "-"
        print(f"{row.name:<14} {row.state:<14} {row.address:<24} {pid:>8}  {row.log}")
    if not any(r.name == "spark-master" and r.state == "running" for r in rows):
        print(f"{'spark':<14} {'in-process':<14} {'local[*] (default)':<24} {'-':>8}  -")
    return 0


def cmd_stack_env(args: argparse.Namespace) -> int:
    home = stack_home(state_dir())
    rows = {row.name: row for row in embedded_stack().status()}
    if any(rows[n].state != "running" for n in ("kafka", "minio")):
        raise MvsinkError("the embedded stack is not running: run `mvsink stack up` first")
    print(f"export MVSINK_KAFKA_BOOTSTRAP={rows['kafka'].address}")
    print(f"export MVSINK_S3_ENDPOINT={rows['minio'].address}")
    print(f"export MVSINK_S3_ACCESS_KEY_FILE={home / 'credentials' / 's3-access-key'}")
    print(f"export MVSINK_S3_SECRET_KEY_FILE={home / 'credentials' / 's3-secret-key'}")
    master = rows.get("spark-master")
    if master is not None and master.state == "running":
        print(f"export MVSINK_SPARK_MASTER={master.address}")
    schema_registry = rows.get("registry")
    if schema_registry is not None and schema_registry.state == "running":
        print(f"export MVSINK_SCHEMA_REGISTRY_URL={registry_url(schema_registry.address)}")
    return 0


def add_compose(commands: Commands) -> None:
    """`mvsink compose verify`."""
    compose = commands.add_parser("compose", help="the docker compose deployment")
    compose_commands = compose.add_subparsers(
        dest="compose_command", required=True, metavar="ACTION"
    )
    verify = compose_commands.add_parser(
        "verify",
        help="engine, images, up scaled, kill and restart, converge, down (docs/operations.md §2)",
    )
    verify.add_argument("--keep", action="store_true", help="leave the project running")
    verify.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to wait for each convergence"
    )
    verify.add_argument("--out", default="bench-out", help="directory for compose.json")
    verify.set_defaults(func=cmd_compose_verify)


def cmd_compose_verify(args: argparse.Namespace) -> int:
    from mvsink.tools.compose.verify import run_verify

    figures = run_verify(
        state_dir() / "compose", cache_dir(), say, keep=args.keep, timeout=args.timeout
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compose.json").write_text(json.dumps(figures, indent=2, default=str))
    return 0


def add_provision(commands: Commands) -> None:
    """`mvsink provision`."""
    commands.add_parser("provision", help="create the sink's topics and bucket").set_defaults(
        func=cmd_provision
    )


def provision_sink(config: Config) -> None:
    """Provision `config`'s sink (`mvsink.tools.provision`) and say what was created."""
    from mvsink.tools.provision import provision

    result = provision(config)
    created = ", ".join(result.topics_created) or "none (all existed)"
    shard = (
        ""
        if result.shard_upper is None
        else f"; shard {config.shard_id} upper {result.shard_upper}"
    )
    subjects = (
        f"; schemas registered under {', '.join(result.subjects)} in {config.schema_registry_url}"
        if result.subjects
        else ""
    )
    say(
        f"sink {config.sink_id}: topics created: {created}; "
        f"bucket {config.s3.bucket}: {'created' if result.bucket_created else 'exists'}{shard}"
        f"{subjects}"
    )


def cmd_provision(args: argparse.Namespace) -> int:
    provision_sink(stack_config(args.config))
    return 0


def add_demo(commands: Commands) -> None:
    """`mvsink demo`."""
    demo = commands.add_parser("demo", help="stack up + the whole pipeline on a demo view")
    demo_arguments(demo, cmd_demo, ticks=8, orders=200, orders_help="order events per tick")


def cmd_demo(args: argparse.Namespace) -> int:
    from mvsink.tools.demo import run_demo

    # run_demo provisions a sink of its own: the configured one is left alone.
    return demo_on_stack(args, run_demo)


def add_view(commands: Commands) -> None:
    """`mvsink view`."""
    view = commands.add_parser("view", help="the demo's view job alone, for the configured sink")
    view.add_argument("--ticks", type=int, default=0, help="0 = until SIGTERM")
    view.add_argument("--orders", type=int, default=200, help="order events per tick")
    view.add_argument("--interval", type=float, default=1.0, help="seconds per tick")
    view.set_defaults(func=cmd_view)


def cmd_view(args: argparse.Namespace) -> int:
    from mvsink.io.service import Stopping, quiet_retries
    from mvsink.tools.demo import run_view

    quiet_retries()
    stopping = Stopping()
    stopping.install()
    config = stack_config(args.config)
    ticks = run_view(config, say, args.ticks, args.orders, args.interval, lambda: stopping.stopped)
    say(f"view stopped after {ticks} ticks")
    return 0


def add_smoke(commands: Commands) -> None:
    """`mvsink smoke`."""
    smoke = commands.add_parser("smoke", help="stack up + one record of each contract + CAS")
    smoke.add_argument("--timeout", type=float, default=180.0)
    smoke.set_defaults(func=cmd_smoke)


def cmd_smoke(args: argparse.Namespace) -> int:
    from mvsink.tools.smoke import run_smoke

    embedded_stack().up(timeout=args.timeout)
    config = stack_config(args.config)
    # A sink of its own, so the smoke records never reach a real sink's `descs`/`batches`.
    smoke_id = f"{config.sink_id}-smoke"
    smoke = replace(
        config,
        sink_id=smoke_id,
        shard_id=smoke_id,
        row_schema="",
        topics=Topics.for_sink(smoke_id, config.topics.frontiers),
    )
    provision_sink(smoke)
    run_smoke(smoke, say)
    return 0
