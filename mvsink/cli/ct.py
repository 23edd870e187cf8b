"""`mvsink ct run|show|demo`: continual tasks (`services.ct`, definitions in `examples/ct/`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from mvsink.cli.common import demo_arguments, demo_on_stack
from mvsink.core.errors import MvsinkError
from mvsink.io.config import config_env
from mvsink.io.service import module_process
from mvsink.stack.state import stack_config

if TYPE_CHECKING:
    from mvsink.cli.common import Commands


def add_ct(commands: Commands) -> None:
    """`mvsink ct ACTION`."""
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
    demo_arguments(
        ct_demo, cmd_ct_demo, ticks=12, orders=20, orders_help="at most this many orders a tick"
    )


def cmd_ct_run(args: argparse.Namespace) -> int:
    from mvsink.io.ct_definition import load_definition

    load_definition(args.task)  # a bad definition fails here, before Spark starts
    # The configuration loaded here (the running embedded stack's endpoints included).
    env = {**os.environ, **config_env(stack_config(args.config))}
    env["MVSINK_CT_TASK"] = str(Path(args.task).resolve())
    # The continual task service is its own process, as deployed (`python -m services.ct`).
    command, env = module_process("services.ct", env)
    os.execve(command[0], command, env)


def cmd_ct_show(args: argparse.Namespace) -> int:
    from mvsink.core.frontier import meet_all
    from mvsink.io.ct_definition import load_definition
    from mvsink.shard import open_shard

    definition = load_definition(args.task)
    s3 = stack_config(args.config).s3
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

    return demo_on_stack(args, run_ct_demo)
