"""`mvsink shard show|compact|snapshot|sweep`: inspect and maintain a shard."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from typing import TYPE_CHECKING

from mvsink.core.errors import MvsinkError
from mvsink.io.service import say
from mvsink.stack.state import stack_config

if TYPE_CHECKING:
    from mvsink.cli.common import Commands
    from mvsink.shard import Shard


def add_shard(commands: Commands) -> None:
    """`mvsink shard ACTION`, each on `--shard` (default: the configured one)."""
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


def _open_shard(args: argparse.Namespace) -> Shard:
    from mvsink.shard import open_shard

    config = stack_config(args.config)
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

    config = stack_config(args.config)
    shard = _open_shard(args)
    runner: Runner = run_locally
    if args.spark:
        from mvsink.io.spark import spark_session

        runner = spark_runner(spark_session("mvsink-compact", config=config))
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
