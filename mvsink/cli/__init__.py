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
    mvsink dead-letters list|replay SINK   what the services quarantined; send it back
    mvsink inspect TOPIC [-f]         decode and print any of mvsink's topics
    mvsink provision                  create the configured sink's topics, bucket, shard
    mvsink demo                       stack up, then the whole pipeline on a demo view
    mvsink smoke                      stack up, one record of each contract, conditional writes
    mvsink view                       the demo's view job alone (the upstream of a deployment)

Every command reads the configuration of `mvsink.io.config` (`--config FILE`, `MVSINK_*`, and the
running embedded stack). Errors are printed as one clear line and exit with status 2.

The command groups live in this package's modules, each a group's parsers next to its command
functions: `stack` (stack, compose, provision, demo, view, smoke), `shard`, `bench`, `sink`
(desired, promote, sink, repair, dead-letters, inspect), `ct`; `common` holds what they share. Command functions
import what they need when they run, so `mvsink --help` starts fast.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from mvsink.cli import bench, ct, shard, sink, stack
from mvsink.io.service import run_command

# The top-level commands, in the order `mvsink --help` lists them.
_COMMANDS = (
    stack.add_stack,
    shard.add_shard,
    bench.add_bench,
    stack.add_compose,
    sink.add_desired,
    sink.add_promote,
    sink.add_sink,
    sink.add_repair,
    sink.add_dead_letters,
    sink.add_inspect,
    stack.add_provision,
    stack.add_demo,
    stack.add_view,
    ct.add_ct,
    stack.add_smoke,
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used by tests to check compose commands are real)."""
    parser = argparse.ArgumentParser(prog="mvsink", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="TOML config file (default: $MVSINK_CONFIG)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _COMMANDS:
        add(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `mvsink` console script."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return run_command(lambda: func(args))
