"""`mvsink desired`, `promote`, `sink`, `repair`, `dead-letters`, `inspect`: a sink's topics
and replicas.

Publishing desired updates and progress as the upstream does, switching a read-only replica to
writing, a replica's desired partitions and the holds its checkpoints keep on the shard's since,
re-seeding checkpoints whose desired records were deleted, listing and replaying what the
services quarantined, and decoding any of mvsink's topics.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from mvsink.core.errors import MvsinkError
from mvsink.core.frontier import Frontier
from mvsink.io.config import Topics, config_env
from mvsink.io.service import run_module, say
from mvsink.stack.state import stack_config

if TYPE_CHECKING:
    from mvsink.cli.common import Commands
    from mvsink.upstream.producer import DesiredProducer


def add_desired(commands: Commands) -> None:
    """`mvsink desired send|advance`."""
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


def _desired_producer(args: argparse.Namespace) -> DesiredProducer:
    from mvsink.core.rows import parse_row_schema
    from mvsink.shard import open_shard
    from mvsink.upstream.producer import DesiredProducer

    config = stack_config(args.config)
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


def add_promote(commands: Commands) -> None:
    """`mvsink promote SINK`."""
    promote = commands.add_parser("promote", help="switch a read-only sink to writing")
    promote.add_argument("sink", help="sink id")
    promote.set_defaults(func=cmd_promote)


def cmd_promote(args: argparse.Namespace) -> int:
    from confluent_kafka import Producer

    from mvsink.core.messages import SinkControl
    from mvsink.io.kafka import client_config, produce

    config = stack_config(args.config)
    topic = Topics.for_sink(args.sink).control
    producer = Producer(client_config(config.kafka_bootstrap))
    produce(producer, topic, args.sink, SinkControl(read_only=False), framing=config.framing())
    if producer.flush(30):
        raise MvsinkError(f"could not deliver the promotion to {topic}")
    say(f"sink {args.sink} promoted: SinkControl(read_only=false) on {topic}")
    return 0


def add_sink(commands: Commands) -> None:
    """`mvsink sink list`, `mvsink sink show|release|drop SINK`."""
    sink = commands.add_parser("sink", help="the deployment's sinks; a sink's desired partitions")
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
    create = sink_commands.add_parser(
        "create", help="define a sink and create its topics, bucket and shard (as provision)"
    )
    create.add_argument("sink", help="sink id")
    create.add_argument("--shard", dest="shard_id", help="shard id (default: the sink id)")
    create.add_argument("--partitions", type=int, help="P (default: the configured one)")
    create.add_argument("--append-workers", type=int, help="A (default: the configured one)")
    create.add_argument("--partitioning", type=int, help="(default: the configured one)")
    create.add_argument("--as-of", type=int, help="the first time (default: the configured one)")
    create.add_argument("--retain-history", type=int, help="(default: the configured one)")
    create.add_argument("--row-schema", help="`name type, ...` (default: the configured one)")
    create.set_defaults(func=cmd_sink_create)
    sink_list = sink_commands.add_parser(
        "list", help="every sink's definition (the sinks topic), its shard's upper and since"
    )
    sink_list.add_argument("--dropped", action="store_true", help="the dropped sinks too")
    sink_list.set_defaults(func=cmd_sink_list)
    sink_drop = sink_commands.add_parser(
        "drop", help="drop a sink: its replicas refuse to start, its holds are released"
    )
    sink_drop.add_argument("sink", help="sink id")
    sink_drop.add_argument(
        "--purge", action="store_true", help="also delete its topics, checkpoints and shard"
    )
    sink_drop.add_argument("--yes", action="store_true", help="drop, not only show the plan")
    sink_drop.set_defaults(func=cmd_sink_drop)


def cmd_sink_create(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from mvsink.cli.stack import provision_sink
    from mvsink.io.sinks import definitions, refusal

    base = stack_config(args.config)
    given = {
        name: getattr(args, name)
        for name in (
            "partitions",
            "append_workers",
            "partitioning",
            "as_of",
            "retain_history",
            "row_schema",
        )
        if getattr(args, name) is not None
    }
    config = replace(
        base,
        sink_id=args.sink,
        shard_id=args.shard_id or args.sink,
        topics=Topics.for_sink(args.sink, base.topics.frontiers, base.topics.sinks),
        **given,
    )
    existing = definitions(config).get(args.sink)
    refused = None if existing is None else refusal(config, existing)
    if refused is not None:
        raise MvsinkError(f"sink {args.sink} exists with other settings: {refused}")
    provision_sink(config)
    return 0


def cmd_sink_list(args: argparse.Namespace) -> int:
    from mvsink.io.sinks import definitions
    from mvsink.shard import open_shard
    from mvsink.tools.sinks import progress

    config = stack_config(args.config)
    found = definitions(config)
    shown = sorted(d.sink_id for d in found.values() if args.dropped or not d.dropped)
    where = progress(config, (found[s] for s in shown))
    for sink_id in shown:
        d, at = found[sink_id], where[sink_id]
        try:
            state = open_shard(d.shard_id, None, config.s3, config.shard_timing()).state()
            lag = at.lag(state.upper)
            shard = (
                f"upper {state.upper}\tsince {state.since}\tdesired {at.desired}\t"
                f"lag {'?' if lag is None else lag}"
            )
        except MvsinkError as error:  # not created yet (no row schema provisioned), or gone
            shard = f"shard: {error}"
        print(
            f"{d.sink_id}\t{'dropped' if d.dropped else 'defined'}\tshard {d.shard_id}\tP {d.partitions}\tA {d.append_workers}\t"
            f"partitioning {d.partitioning}\tas_of {d.as_of}\t{shard}\t"
            f"write {_owners(at.writers)}\tappend {_owners(at.appenders)}\t"
            f"defined by {d.defined_by} at {_utc(d.at_ms)}",
            flush=True,
        )
    dropped = sum(d.dropped for d in found.values())
    say(f"{len(found) - dropped} sinks on {config.topics.sinks} ({dropped} dropped)")
    return 0


def _owners(owners: list[tuple[str, list[int]]]) -> str:
    """`host [partitions], ...` of each member, or `none` while there is none."""
    return ", ".join(f"{host} {parts}" for host, parts in owners) or "none"


def _utc(ms: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="seconds")


def cmd_sink_drop(args: argparse.Namespace) -> int:
    from mvsink.io.sinks import definitions, sink_of
    from mvsink.tools.sinks import drop_sink, own_topics

    config = stack_config(args.config)
    definition = definitions(config).get(args.sink)
    if definition is None:
        raise MvsinkError(f"sink {args.sink} is not defined on {config.topics.sinks}")
    if definition.dropped and not args.purge:
        raise MvsinkError(f"sink {args.sink} was dropped already (`--purge` deletes what it owns)")
    sink = sink_of(config, definition)
    say(f"sink {args.sink}: shard {sink.shard_id}, P {sink.partitions}, A {sink.append_workers}")
    if not definition.dropped:
        say("drop: its definition written dropped (its replicas refuse to start, running ones")
        say("  stop within [kafka] topic_check_interval), its checkpoints' holds released")
    if args.purge:
        say(f"purge: then topics {', '.join(own_topics(sink))}, its keys on")
        say(f"  {sink.topics.frontiers}, its checkpoints and its shard (unless another sink's")
        say("  definition names the shard) deleted: only once its services stopped")
    if not args.yes:
        say("nothing done: run it again with --yes")
        return 0
    dropped = drop_sink(config, args.sink, args.purge)
    say(f"dropped sink {args.sink}; released holds: {list(dropped.holds_released)}")
    if args.purge:
        say(
            f"purged {len(dropped.topics_deleted)} topics and {dropped.objects_deleted} objects"
            + (f"; kept the shard: {dropped.shard_kept}" if dropped.shard_kept else "")
        )
    return 0


def _write_tool(args: argparse.Namespace, *argv: str) -> int:
    """Run the write service's operator tool (`python -m services.write.repair`) on this sink:
    the checkpoints are the write service's own, so the tool that reads and re-seeds them ships
    with it, and the library only starts it. It gets the configuration loaded here (the running
    embedded stack's endpoints included) as its environment."""
    env = {**os.environ, **config_env(stack_config(args.config))}
    shard = ["--shard", args.shard] if args.shard else []
    return run_module("services.write.repair", [*argv, args.sink, *shard], env)


def cmd_sink_show(args: argparse.Namespace) -> int:
    return _write_tool(args, "show")


def cmd_sink_release(args: argparse.Namespace) -> int:
    from mvsink.shard import open_shard
    from mvsink.tools.sinks import sink_holds

    config = stack_config(args.config)
    shard = open_shard(args.shard or config.shard_id, None, config.s3, config.shard_timing())
    held = sink_holds(shard, args.sink)
    if not held:
        say(f"shard {shard.shard_id} holds nothing for sink {args.sink}")
        return 0
    since = {h.holder_id: h.since for h in shard.state().holds}
    for holder in held:
        say(f"{holder} holds since at {since[holder]}")
    if not args.yes:
        raise MvsinkError(
            "releasing them lets since pass the sink's checkpoints (a dropped "
            "sink's are no longer needed): run it again with --yes"
        )
    state = shard.release_holds(held)
    say(f"released {len(held)} holds of sink {args.sink}; since is now {state.since}")
    return 0


def add_repair(commands: Commands) -> None:
    """`mvsink repair SINK`."""
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


def cmd_repair(args: argparse.Namespace) -> int:
    partitions = [f"--partition={p}" for p in args.partition or []]
    return _write_tool(args, "repair", *partitions, *(["--yes"] if args.yes else []))


def add_dead_letters(commands: Commands) -> None:
    """`mvsink dead-letters list|replay SINK`."""
    letters = commands.add_parser(
        "dead-letters", help="list a sink's quarantined records, or send them back"
    )
    actions = letters.add_subparsers(dest="letters_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="one line per dead letter: offset, when, from, why")
    listing.add_argument("sink", help="sink id")
    listing.set_defaults(func=cmd_dead_letters_list)
    again = actions.add_parser(
        "replay", help="send dead letters back to the topic they were read from, checked again"
    )
    again.add_argument("sink", help="sink id")
    again.add_argument("--from", dest="first", type=int, default=0, help="first letter offset")
    again.add_argument("--to", dest="last", type=int, default=None, help="last letter offset")
    again.add_argument("--yes", action="store_true", help="send, not only show the plan")
    again.set_defaults(func=cmd_dead_letters_replay)


def cmd_dead_letters_list(args: argparse.Namespace) -> int:
    from mvsink.tools.dead_letters import read_letters

    topics = Topics.for_sink(args.sink)
    letters = read_letters(stack_config(args.config).kafka_bootstrap, topics.dead_letter)
    for letter in letters:
        print(letter.line(), flush=True)
    say(f"{len(letters)} dead letters on {topics.dead_letter}")
    return 0


def cmd_dead_letters_replay(args: argparse.Namespace) -> int:
    from mvsink.tools import dead_letters as tool

    config = stack_config(args.config)
    topics = Topics.for_sink(args.sink, config.topics.frontiers)
    bootstrap = config.kafka_bootstrap
    chosen = [
        letter
        for letter in tool.read_letters(bootstrap, topics.dead_letter)
        if args.first <= letter.offset and (args.last is None or letter.offset <= args.last)
    ]
    counts = tool.partition_counts(bootstrap, (topics.desired, topics.batches, topics.descs))
    plans = [tool.plan_replay(letter, topics, counts, config.framing().lookup) for letter in chosen]
    for plan in plans:
        if isinstance(plan, tool.Send):
            say(f"{plan.letter.offset}: to {plan.topic}[{plan.partition}]")
        else:
            say(f"{plan.letter.offset}: back to {topics.dead_letter}: {plan.reason}")
    sent = sum(isinstance(plan, tool.Send) for plan in plans)
    if not args.yes:
        say(f"{sent} of {len(plans)} letters would be sent back: run it again with --yes")
        return 0
    tool.replay(bootstrap, args.sink, topics, plans)
    say(
        f"replayed {sent} of {len(plans)} letters; {len(plans) - sent} went back to "
        f"{topics.dead_letter} with their reason"
    )
    return 0


def add_inspect(commands: Commands) -> None:
    """`mvsink inspect TOPIC`."""
    inspect = commands.add_parser("inspect", help="decode and print any mvsink topic")
    inspect.add_argument("topic")
    inspect.add_argument("--follow", "-f", action="store_true", help="keep printing new records")
    inspect.add_argument("--limit", type=int, default=0, help="stop after N records")
    inspect.set_defaults(func=cmd_inspect)


def cmd_inspect(args: argparse.Namespace) -> int:
    from mvsink.tools.inspect import inspect_topic

    config = stack_config(args.config)
    inspect_topic(
        config.kafka_bootstrap,
        args.topic,
        follow=args.follow,
        limit=args.limit,
        framing=config.framing(),
    )
    return 0
