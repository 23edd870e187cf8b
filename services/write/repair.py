"""The desired topic's life cycle as an operator sees it: where each desired partition starts,
how far its checkpoint folded it, and what the shard holds for it (`mvsink sink show`); and the
explicit, audited recovery of a partition whose checkpoint needs desired records the broker
deleted (`mvsink repair`).

A write task never folds across deleted records (`services.write.fold`): without them it would
retract rows whose insertions it cannot see. Such a partition stays where it is until its
checkpoint is restored, or re-seeded by `repair`, which trusts the shard:

```
 desired[p]:  ... deleted ... | log start ... Progress(f) | o ...... end
 shard:       contents before f (trusted to equal desired before f)   since <= f <= upper
 seeded checkpoint: folded_offset = o, desired and persist folded to f,
                    corrections = updates before o at times >= f (published ahead of f)
```

`f` is the last progress frontier of the partition's remaining records with `since <= f <=
upper`: the shard's changes at `f` and later are exact (merges keep times at or after `since`
distinct), so the task folds them from there and corrects whatever differs. What it cannot know:
updates at times `>= f` published *before the log start* (a producer that publishes each time
before advancing past it, as `DesiredProducer` and `publish_dataframe` do, has none), and
whether the shard really equalled desired before `f` (a foreign write before `f` is kept).
The partition's critical hold keeps since at or before `f` until the write service continues
(`reseed`: set there first if there is none, moved up to `f` only once the seed is written; a
partition whose chain went on since the plan is refused), and the repair is logged and recorded as a `SinkRepair` on
`<sink>.control` (key `repair:<sink>`; `mvsink inspect <sink>.control` shows it).

`python -m services.write.repair show|repair SINK` is the tool (`main`); `mvsink sink show` and
`mvsink repair` start it.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Producer

from mvsink.core.errors import DecodeError, MvsinkError
from mvsink.core.frontier import Frontier
from mvsink.core.messages import Progress, RepairedPartition, SinkRepair
from mvsink.core.rows import parse_row_schema, updates_decoder
from mvsink.core.updates import TIME, part_schema
from mvsink.io.config import Config, load_config
from mvsink.io.kafka import (
    NO_RESET,
    READ_TO_END,
    Reader,
    client_config,
    poll_message,
    produce,
    sink_config,
    watermarks,
)
from mvsink.io.service import run_command, say, writer_identity
from mvsink.shard import Shard, ShardState, open_shard
from mvsink.stack.state import stack_endpoints
from mvsink.upstream.desired import decode_desired
from services.write import checkpoint

log = logging.getLogger("mvsink.write.repair")


@dataclass(frozen=True)
class PartitionReport:
    """One desired partition of a sink, as `mvsink sink show` prints it."""

    partition: int
    log_start: int
    end: int
    #: The newest checkpoint version (-1: none) and what it folded.
    version: int
    folded_offset: int | None
    persist_folded: Frontier | None
    #: The partition's critical hold in the shard, if any.
    hold: Frontier | None
    #: Why the partition cannot continue (its checkpoint needs deleted records), or None.
    needs_repair: str | None


def report(config: Config, shard: Shard, state: ShardState | None = None) -> list[PartitionReport]:
    """Each desired partition of `config`'s sink: log start, end, checkpoint, hold, and whether
    it needs a repair (module docs)."""
    state = state or shard.state()
    marks = watermarks(config.kafka_bootstrap, config.topics.desired, range(config.partitions))
    checkpoints = checkpoint.Checkpoints.of(config.s3)
    found = []
    for p in range(config.partitions):
        low, high = marks[p]
        version = checkpoints.latest(config.sink_id, p)
        meta = checkpoints.read_meta(config.sink_id, p, version)
        folded = meta["folded_offset"] if meta else (0 if version < 0 else None)
        persist = Frontier.from_elements(meta["persist_folded"]) if meta else None
        hold = state.hold(checkpoint.holder_id(config.sink_id, p))
        needs = None
        if persist is not None and checkpoint.since_passed(persist, state.since) and low > 0:
            needs = (
                f"the shard's since {state.since} passed checkpoint {version}'s "
                f"persist_folded {persist}: a rebuild needs offset 0, deleted below {low}"
            )
        elif folded is not None and folded < low:
            what = "no checkpoint: a cold start" if version < 0 else f"checkpoint {version}"
            needs = f"{what} needs offset {folded}, deleted below {low}"
        found.append(
            PartitionReport(
                p, low, high, version, folded, persist, hold.since if hold else None, needs
            )
        )
    return found


@dataclass(frozen=True)
class Seed:
    """What `repair` writes for one partition (module docs)."""

    partition: int
    #: The progress frontier trusted: the shard's contents before it are taken as desired's.
    frontier: Frontier
    #: The offset just after that frontier's `Progress`: the task reads on from there.
    folded_offset: int
    log_start: int
    #: Updates before `folded_offset` at times `>= frontier`, kept as corrections.
    ahead: pa.Table
    #: The checkpoint version it replaces (-1: none).
    replaces: int


def plan(
    config: Config, shard: Shard, partition: int, state: ShardState, timeout: float = 120.0
) -> Seed:
    """The seed of `partition` from its remaining desired records (module docs).

    Raises:
        MvsinkError: no progress record of the partition lies in `[since, upper]`.
    """
    row_schema = parse_row_schema(config.row_schema) if config.row_schema else shard.schema
    topic = config.topics.desired
    low, high = watermarks(config.kafka_bootstrap, topic, [partition])[partition]
    upper, since = state.upper, state.since
    best: tuple[Frontier, int] | None = None  # the last Progress in [since, upper], and after it
    tables: list[tuple[int, pa.Table]] = []
    reader = Reader(config.kafka_bootstrap, topic, {partition: low}, {**READ_TO_END, **NO_RESET})
    framing = config.framing()
    decode_rows = updates_decoder(row_schema)
    deadline = time.monotonic() + timeout
    try:
        done: list[int] = []
        while not done and high > low:
            if time.monotonic() > deadline:
                raise MvsinkError(f"reading {topic}[{partition}] took over {timeout:.0f}s")
            message = poll_message(reader, 0.5, on_eof=done.append)
            if message is None:
                continue
            try:
                decoded = decode_desired(
                    message, row_schema, decode_rows, None, framing, config.max_record_bytes
                )
            except DecodeError:
                continue  # the write tasks quarantine it too
            offset = int(message.offset() or 0)
            if isinstance(decoded, Progress):
                frontier = decoded.frontier
                if since.less_equal(frontier) and frontier.less_equal(upper):
                    best = (frontier, offset + 1)
            elif decoded.num_rows:
                tables.append((offset, decoded))
    finally:
        reader.close()
    if best is None:
        raise MvsinkError(
            f"sink {config.sink_id}: {topic}[{partition}] (offsets {low}..{high}) has no progress "
            f"record at or after the shard's since {since} and at or before its upper {upper}: "
            "there is no point where its remaining records meet the shard's exact history"
        )
    frontier, folded_offset = best
    assert frontier.time is not None
    ahead = [
        t.filter(pc.greater_equal(t.column(TIME), frontier.time))
        for o, t in tables
        if o < folded_offset
    ]
    ahead_table = pa.concat_tables(ahead) if ahead else None
    replaces = checkpoint.Checkpoints.of(config.s3).latest(config.sink_id, partition)
    if ahead_table is None:
        ahead_table = part_schema(row_schema).empty_table()
    return Seed(partition, frontier, folded_offset, low, ahead_table, replaces)


def reseed(
    shard: Shard,
    checkpoints: checkpoint.Checkpoints,
    sink_id: str,
    seeds: list[Seed],
    writer_id: str,
    row_schema: pa.Schema,
    say: Callable[[str], None] = lambda _: None,
) -> list[tuple[Seed, int]]:
    """Write each of `seeds` as its partition's next checkpoint version (module docs); each
    seed with its version. The shard's since must not pass a seed's frontier before the write
    service folds on from there: a partition without a critical hold is held there first; one
    held at or before it already is, and its hold moves up to the frontier once every seed is
    written (moved before, a seed not written would leave the checkpoint it was to replace
    unheld: invariant 0 of `services.write`). A partition whose chain went on since the plan
    (a version newer than the one its seed replaces, or one folded or held past its frontier)
    is refused: its driver would move the hold back past the seed.

    Raises:
        MvsinkError: a partition whose chain went on, or another writer created a seed's
            version first (run the repair again).
    """
    state = shard.state()
    first = {}
    for seed in seeds:
        holder = checkpoint.holder_id(sink_id, seed.partition)
        held = state.hold(holder)
        _check_replaces(checkpoints, sink_id, seed, held.since if held else None)
        if held is None:
            first[holder] = seed.frontier
    if first:
        shard.set_holds(first)
    done: list[tuple[Seed, int]] = []
    for seed in seeds:
        version = checkpoints.seed(
            sink_id,
            seed.partition,
            writer_id,
            row_schema,
            seed.frontier,
            seed.folded_offset,
            seed.ahead if seed.ahead.num_rows else None,
            replaces=seed.replaces,
        )
        if version is None:
            raise MvsinkError(
                f"partition {seed.partition}: another writer checkpointed it "
                "meanwhile; run the repair again"
            )
        log.warning(
            "sink %s partition %d repaired: checkpoint %d seeded from shard %s at %s, "
            "desired from offset %d",
            sink_id,
            seed.partition,
            version,
            shard.shard_id,
            seed.frontier,
            seed.folded_offset,
        )
        say(f"partition {seed.partition}: checkpoint version {version} written")
        done.append((seed, version))
    shard.set_holds({checkpoint.holder_id(sink_id, s.partition): s.frontier for s, _ in done})
    return done


def _check_replaces(
    checkpoints: checkpoint.Checkpoints, sink_id: str, seed: Seed, held: Frontier | None
) -> None:
    """Refuse a seed whose partition's chain went on since the plan: a newer version than the
    one it replaces, or one (or a hold) past its frontier, which a driver would hold `since`
    at, past the seed.

    Raises:
        MvsinkError: the chain went on (run the repair again).
    """
    p, frontier = seed.partition, seed.frontier
    latest = checkpoints.latest(sink_id, p)
    meta = checkpoints.read_meta(sink_id, p, latest)
    folded = Frontier.from_elements(meta["persist_folded"]) if meta else None
    past = [f for f in (folded, held) if f is not None and not f.less_equal(frontier)]
    if latest != seed.replaces or past:
        raise MvsinkError(
            f"partition {p}: its checkpoint chain went on since the repair was planned "
            f"(version {latest}, planned to replace {seed.replaces}; folded or held at "
            f"{past[0] if past else folded}, the repair trusts {frontier}): a write driver still "
            "continues it; run the repair again"
        )


def describe(config: Config, state: ShardState, seed: Seed) -> str:
    """What a repair of one partition trusts and what it cannot know, before it acts."""
    return (
        f"partition {seed.partition}: replaces checkpoint {seed.replaces}; trusts the shard "
        f"{state.shard_id} (upper {state.upper}, since {state.since}) to equal desired before "
        f"{seed.frontier}; continues desired from offset {seed.folded_offset} (log start "
        f"{seed.log_start}), folds the shard's changes from {seed.frontier}; keeps "
        f"{seed.ahead.num_rows} update(s) read before that offset at times >= {seed.frontier}. "
        f"Cannot know: updates at times >= {seed.frontier} published before offset "
        f"{seed.log_start}, nor whether the shard before {seed.frontier} was right"
    )


def repair(
    config: Config,
    partitions: list[int] | None,
    writer_id: str,
    say: Callable[[str], None],
    confirm: Callable[[], bool],
) -> list[Seed]:
    """Re-seed the checkpoints of `partitions` (those that need it if None) from the shard
    (module docs), after printing what it trusts and asking `confirm`; the seeds written.

    Raises:
        MvsinkError: nothing to repair, a partition without a meeting point, a lost race.
    """
    shard = open_shard(config.shard_id, None, config.s3, config.shard_timing())
    state = shard.state()
    reports = report(config, shard, state)
    chosen = (
        partitions if partitions is not None else [r.partition for r in reports if r.needs_repair]
    )
    for r in reports:
        say(
            f"partition {r.partition}: log start {r.log_start}, end {r.end}, checkpoint "
            f"{r.version} folded offset {r.folded_offset}: "
            f"{r.needs_repair or 'continues from its checkpoint'}"
        )
    if not chosen:
        raise MvsinkError(
            f"sink {config.sink_id}: no partition needs a repair (name them with "
            "--partition to re-seed them anyway)"
        )
    seeds = [plan(config, shard, p, state) for p in chosen]
    for seed in seeds:
        say(describe(config, state, seed))
    if not confirm():
        raise MvsinkError("repair not confirmed: nothing was changed")
    row_schema = parse_row_schema(config.row_schema) if config.row_schema else shard.schema
    checkpoints = checkpoint.Checkpoints.of(config.s3)
    done = reseed(shard, checkpoints, config.sink_id, seeds, writer_id, row_schema, say)
    record = SinkRepair(
        config.sink_id,
        config.shard_id,
        writer_id,
        int(time.time() * 1000),
        state.upper,
        state.since,
        tuple(
            RepairedPartition(
                s.partition,
                s.frontier,
                s.folded_offset,
                s.log_start,
                v,
                s.replaces,
                s.ahead.num_rows,
            )
            for s, v in done
        ),
    )
    producer = Producer(client_config(config.kafka_bootstrap))
    produce(producer, config.topics.control, record.key, record, framing=config.framing())
    if producer.flush(30):
        raise MvsinkError(
            f"the checkpoints were re-seeded, but the SinkRepair record did not "
            f"reach {config.topics.control}"
        )
    say(f"repair recorded on {config.topics.control} under {record.key}")
    return [s for s, _ in done]


def show(config: Config) -> int:
    """Print `report` as a table (`mvsink sink show`): 0."""
    shard = open_shard(config.shard_id, None, config.s3, config.shard_timing())
    state = shard.state()
    print(
        f"sink {config.sink_id}  shard {config.shard_id}: upper {state.upper}, since "
        f"{state.since}; desired {config.topics.desired}, {config.partitions} partitions"
    )
    print(
        f"{'p':>3} {'log start':>10} {'end':>10} {'checkpoint':>10} {'folded':>10} "
        f"{'persist':>10} {'hold':>10}  state"
    )
    bad = 0
    for r in report(config, shard, state):
        bad += r.needs_repair is not None
        print(
            f"{r.partition:>3} {r.log_start:>10} {r.end:>10} {r.version:>10} "
            f"{'-' if r.folded_offset is None else r.folded_offset:>10} "
            f"{r.persist_folded or '-'!s:>10} {r.hold or '-'!s:>10}  "
            f"{r.needs_repair or 'ok'}"
        )
    if bad:
        print(f"{bad} partition(s) need `mvsink repair {config.sink_id}`")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`show SINK` or `repair SINK [--partition P]... [--yes]`, with `--shard` and the
    configuration of `mvsink.io.config` (`MVSINK_CONFIG`, `MVSINK_*`)."""
    parser = argparse.ArgumentParser(prog="python -m services.write.repair")
    parser.add_argument("action", choices=("show", "repair"))
    parser.add_argument("sink", help="sink id")
    parser.add_argument("--shard", default="", help="shard id (default: the configured one)")
    parser.add_argument("--partition", type=int, action="append", help="re-seed this partition")
    parser.add_argument("--yes", action="store_true", help="do not ask before acting")
    parser.add_argument("--writer-id", default="", help="who repairs (default: this process)")
    args = parser.parse_args(argv)

    def command() -> int:
        config = sink_config(load_config(endpoints=stack_endpoints()), args.sink, args.shard)
        if args.action == "show":
            return show(config)

        def confirm() -> bool:
            if args.yes:
                return True
            if not sys.stdin.isatty():
                say("not confirmed: run it again with --yes once you have read the above")
                return False
            return input("re-seed these checkpoints from the shard? [y/N] ").strip().lower() == "y"

        writer_id = args.writer_id or writer_identity(config, "repair")
        seeds = repair(config, args.partition or None, writer_id, say, confirm)
        say(
            f"sink {config.sink_id}: repaired partitions {[s.partition for s in seeds]}; the "
            "write service continues from the new checkpoints by itself"
        )
        return 0

    return run_command(command)


if __name__ == "__main__":
    sys.exit(main())
