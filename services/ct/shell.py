"""The continual task process: follows its inputs' shards from the output's upper, runs the logic
on Spark at every time an input changed at, and writes the result at that time with the seed's
`truncating_compare_and_append`. All decisions of what to write when are `SinkState`'s.

Steps of `ContinualTask`:
1. `start`: open the output (created with the definition's schema on first use); choose where
   the inputs are read from (the output's upper, or for a task that wrote nothing the later of
   `as_of` and the inputs' `since`) and lease every input and reference there (their `since`
   may not pass it, so the changes from there stay readable at their own times); read the
   output's contents as of its upper (the self-reference);
2. `poll`: for each input whose upper moved, read only the batches that overlap
   `[read upper, new upper)` (a restart starts at the output's upper: input history behind it
   is never read), keep the changes, release the times at which they changed once every
   input's upper has passed them (`TimesReduce`; the times are counted in Arrow, as the seed's
   `times_extract` would with a count per update);
3. `work`: ask `SinkState.process` for the next write; when it waits for the data of an append
   time, run the logic at that time (inputs' changes at it, references as of it, the output as
   of the time before) and hand it a handle on the diffs (they stay in Arrow); write with `truncating_compare_and_append`: a
   time a racing replica wrote first is dropped, and the output's contents read again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import Counter, Gauge

from mvsink.core.errors import ConfigError, MvsinkError
from mvsink.core.frontier import Frontier, meet_all
from mvsink.core.messages import SinkControl
from mvsink.core.settings import S3Settings, Timing
from mvsink.core.updates import DIFF, TIME, advance_times, part_schema
from mvsink.core.updates import consolidate as consolidate_updates
from mvsink.io.config import Config, Topics
from mvsink.io.ct_definition import Definition, load_definition
from mvsink.io.kafka import Reader, TopicSpec, drain, ensure_topics, tail_consumer
from mvsink.io.registry import Framing
from mvsink.io.service import Stopping, probe_store, writer_identity
from mvsink.shard import AsOfBeforeSince, IndefiniteAppend, PartGone, Shard, open_shard
from services.ct.logic import consolidate, run_logic
from services.ct.sink import truncating_compare_and_append
from services.ct.state import SinkState, TimesReduce

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("mvsink.ct")

OUTPUT_UPPER = Gauge("mvsink_ct_output_upper", "The output shard's upper", ["task"])
INPUT_FRONTIER = Gauge("mvsink_ct_input_frontier", "The meet of the inputs' uppers read", ["task"])
WRITTEN = Counter("mvsink_ct_times_written", "Append times written with data", ["task"])
DROPPED = Counter("mvsink_ct_times_dropped", "Writes a racing replica got to first", ["task"])
INPUT_BYTES = Counter("mvsink_ct_input_bytes_read", "Bytes of input parts read", ["task"])
LOGIC_SECONDS = Counter("mvsink_ct_logic_seconds", "Seconds spent running the logic", ["task"])
#: How often a lease is renewed at the latest, as a share of its duration.
RENEW_SHARE = 1 / 3


class ContinualTask:
    """One replica of a continual task. Not thread-safe: one loop calls `poll` and `work`."""

    def __init__(
        self,
        definition: Definition,
        s3: S3Settings,
        timing: Timing,
        spark: SparkSession,
        writer_id: str,
        read_only: bool = False,
        report: Callable[[int | None, int | None], None] | None = None,
    ) -> None:
        self.definition = definition
        #: Where the task reports its output's upper and its target (the service's health,
        #: `mvsink.io.service.Stopping.report`); None: nowhere.
        self.report = report
        #: A read-only replica follows the inputs and the output and writes nothing (until
        #: `promote`): it stays at the output's upper with the inputs' changes from there.
        self.read_only = read_only
        self.spark = spark
        self.writer_id = writer_id
        self.timing = timing
        #: One lease per task, shared by its replicas (a renewal never moves a hold back).
        self.reader_id = f"ct.{definition.name}"
        self.output = open_shard(definition.output_shard, definition.output_schema, s3, timing)
        self.readers: dict[str, Shard] = {
            name: open_shard(shard_id, None, s3, timing)
            for name, shard_id in definition.shards().items()
        }
        #: `to_append` holds one handle per time the logic ran at, `(time, time, 1)`; its diffs
        #: (Arrow, consolidated at that time by `run_logic`) are in `diffs`. `process` decides
        #: when they are written without the rows passing through Python.
        self.sink: SinkState[int] = SinkState()
        self.diffs: dict[int, pa.Table] = {}
        self.times = TimesReduce()
        #: Per input: the upper through which its changes are read, and the changes kept.
        self.read_upper: dict[str, Frontier] = {}
        self.pending: dict[str, pa.Table] = {}
        #: The output's contents as of `sink.output_progress - 1` (the self-reference).
        self.contents = part_schema(definition.output_schema).empty_table()
        #: Where the task reads its inputs from when it starts (`start`).
        self.start_at = Frontier.minimum()
        self.snapshot_first = False
        self.bytes_read = 0
        self.times_written = 0
        self.times_dropped = 0
        self._logic_seconds = 0.0
        self._held: tuple[Frontier, float] | None = None

    # -- 1. start ---------------------------------------------------------------------------

    def start(self) -> Frontier:
        """Lease the shards read, read the output; where the inputs are read from.

        A task whose output's upper has not passed `as_of` (it has written nothing) starts at
        the later of `as_of` and its inputs' and references' `since` (what they can still tell
        apart by time); with `snapshot`, their contents before that are its first changes.
        Its output's upper is not moved here: the first write carries it past the start in one
        append, so a crash before that write starts the task afresh again (snapshot and all).
        A task that has written keeps to its output's upper.
        """
        as_of = Frontier.at(self.definition.as_of)
        upper = self.output.upper()
        fresh = upper.less_equal(as_of)
        start = upper
        if fresh:
            start = as_of
            for shard in self.readers.values():
                start = start.join(shard.lease(self.reader_id).since)
        self.start_at = start
        self.snapshot_first = self.definition.snapshot and fresh
        self._hold(start, force=True)
        for name in self.definition.inputs:
            self.read_upper[name] = start
            self.pending[name] = part_schema(self.readers[name].schema).empty_table()
        self.sink = SinkState(output_progress=upper, to_append_progress=upper)
        self.contents = self.output.snapshot(upper)
        OUTPUT_UPPER.labels(self.definition.name).set(_time(upper))
        log.info(
            "continual task %s starts at output upper %s, reading from %s (as_of %d%s), inputs %s",
            self.definition.name,
            upper,
            start,
            self.definition.as_of,
            ", with the inputs' snapshot" if self.snapshot_first else "",
            {n: self.readers[n].shard_id for n in self.definition.inputs},
        )
        return start

    def _hold(self, upper: Frontier, force: bool = False) -> None:
        """Keep every read shard's `since` at or before `upper` (the restart point): renew when
        the hold moved (at most once a second) or a share of the lease has passed."""
        now = time.monotonic()
        if not force and self._held is not None:
            held, at = self._held
            age = now - at
            if age < self.timing.reader_lease * RENEW_SHARE and (held == upper or age < 1.0):
                return
        for name, shard in self.readers.items():
            try:
                shard.lease(self.reader_id, upper)
            except AsOfBeforeSince as error:
                raise MvsinkError(
                    f"continual task {self.definition.name}: {name} ({shard.shard_id}) is "
                    f"compacted past the output's upper {upper}, so its changes from there are "
                    f"no longer apart by time ({error}). Its lease lapsed: the task was down "
                    f"longer than reader_lease ({self.timing.reader_lease:.0f}s)"
                ) from error
        self._held = (upper, now)

    # -- 2. poll ----------------------------------------------------------------------------

    def poll(self) -> bool:
        """Read what the inputs appended since the last poll; whether any input's upper moved."""
        moved = False
        for name in self.definition.inputs:
            moved |= self._read_input(name)
        progress = meet_all(list(self.read_upper.values()))
        if self.sink.append_times_progress.less_than(progress):
            self.sink.append_times.update(t for t, _ in self.times.advance(progress))
            self.sink.append_times_progress = progress
            INPUT_FRONTIER.labels(self.definition.name).set(_time(progress))
        return moved

    def _read_input(self, name: str) -> bool:
        shard, lower = self.readers[name], self.read_upper[name]
        state = shard.state()
        if not lower.less_than(state.upper):
            return False
        first = self.snapshot_first and lower == self.start_at
        selected = shard.parts_for(
            None, Frontier.minimum() if first else lower, state.upper, state=state
        )
        try:
            table = shard.read_parts(selected)
        except PartGone:
            return False  # a merge replaced a part: the next poll reads the latest version
        read = sum(choice.part.bytes for choice in selected)
        self.bytes_read += read
        INPUT_BYTES.labels(self.definition.name).inc(read)
        times = table.column(TIME)
        keep = pc.less(times, state.upper.time) if state.upper.time is not None else None
        if not first and lower.time is not None:
            at_or_after = pc.greater_equal(times, lower.time)
            keep = at_or_after if keep is None else pc.and_(keep, at_or_after)
        if keep is not None:
            table = table.filter(keep)
        # A part may hold an update and its retraction at one time, as its upstream published
        # them (docs/design.md, Parts): summed first, so a time whose input only cancelled
        # itself runs no logic, as with a consolidated part.
        table = consolidate_updates(table, shard.schema)
        if first and self.start_at.time is not None:
            # The snapshot: the contents before the start are changes at the start.
            table = advance_times(table, self.start_at.time, self.start_at.time)
        self.pending[name] = pa.concat_tables([self.pending[name], table])
        # The times the input changed at, counted in Arrow (the seed's `times_extract` with a
        # count per update, not the diffs' sum: a time whose diffs cancel, such as an update's
        # retraction and insertion, still runs the logic).
        counts = pc.value_counts(table.column(TIME)).flatten()
        self.times.absorb(zip(counts[0].to_pylist(), counts[1].to_pylist(), strict=True))
        self.read_upper[name] = state.upper
        return True

    # -- 3. work ----------------------------------------------------------------------------

    def work(self) -> int:
        """Write everything that can be written now; how many writes were made (a read-only
        replica instead follows the output's upper, and makes none)."""
        if self.read_only:
            self._follow_output()
            return 0
        writes = 0
        while True:
            step = self.sink.process()
            if step is None:
                write_ts = self._data_needed()
                if write_ts is None or not self._run(write_ts):
                    return writes
                continue
            new_upper, updates = step
            try:
                self._write(new_upper, updates)
            except IndefiniteAppend as error:
                # Unknown whether it landed: the next round reads the upper again (a landed
                # write then reads as one a replica made, and the output is read back).
                log.warning(
                    "%s: append to %s indefinite (%s); trying again",
                    self.definition.name,
                    new_upper,
                    error,
                )
                return writes
            writes += 1

    def _data_needed(self) -> int | None:
        """The append time whose data `process` waits for: the first one at or after the
        output's progress. Nothing is written between the two (no input changed there), so the
        output as of the time before it is the output now; its data is computed before the
        upper moves up to it, and one append writes both."""
        sink = self.sink
        pending = [
            t
            for t in sink.append_times
            if sink.output_progress.less_equal_time(t)
            and not sink.append_times_progress.less_equal_time(t)
        ]
        write_ts = min(pending, default=None)
        if write_ts is None:
            return None
        if not sink.to_append_progress.less_equal_time(write_ts):
            return None
        return write_ts

    def _run(self, write_ts: int) -> bool:
        """Run the logic at `write_ts` into the sink's `to_append`; False if a reference is
        not final at `write_ts` yet."""
        references = {}
        for name in self.definition.references:
            shard = self.readers[name]
            if not Frontier.at(write_ts).less_than(shard.upper()):
                return False
            references[name] = shard.snapshot(write_ts + 1)
        # An input's changes at the time, consolidated: a row retracted and inserted again
        # (or, in a snapshot, every version of a row since retracted) is no change.
        changes = {
            name: consolidate(
                table.filter(pc.equal(table.column(TIME), write_ts)),
                self.readers[name].schema,
                write_ts,
            )
            for name, table in self.pending.items()
        }
        started = time.monotonic()
        diffs = run_logic(self.spark, self.definition, write_ts, changes, references, self.contents)
        self._logic_seconds = time.monotonic() - started
        LOGIC_SECONDS.labels(self.definition.name).inc(self._logic_seconds)
        if diffs.num_rows:
            self.diffs[write_ts] = diffs
            self.sink.to_append.append((write_ts, write_ts, 1))
        self.sink.to_append_progress = Frontier.at(write_ts + 1)
        return True

    def _write(self, new_upper: Frontier, updates: list[tuple[int, int, int]]) -> None:
        schema = part_schema(self.definition.output_schema)
        table = pa.concat_tables([schema.empty_table(), *(self.diffs[t] for t, _, _ in updates)])
        before = self.sink.output_progress
        result = truncating_compare_and_append(self.output, table, new_upper, self.writer_id)
        name = self.definition.name
        if result.written and new_upper.time is not None:
            self.contents = consolidate(
                pa.concat_tables([self.contents, table]),
                self.definition.output_schema,
                new_upper.time - 1,
            )
        else:
            self.contents = self.output.snapshot(result.upper)  # a replica wrote: take its result
        if updates:
            if result.written:
                self.times_written += 1
                WRITTEN.labels(name).inc()
                diffs = table.column(DIFF)
                log.info(
                    "%s wrote time %s: %d updates (+%s -%s), logic %.2fs, upper %s",
                    name,
                    updates[0][1],
                    table.num_rows,
                    pc.sum(pc.max_element_wise(diffs, 0)).as_py(),
                    pc.sum(pc.max_element_wise(pc.negate(diffs), 0)).as_py(),
                    self._logic_seconds,
                    result.upper,
                )
            else:
                self.times_dropped += 1
                DROPPED.labels(name).inc()
                log.info(
                    "%s: a replica wrote [%s, %s) first; dropped ours, upper %s",
                    name,
                    before,
                    new_upper,
                    result.upper,
                )
        self._advance_output(result.upper)

    def _follow_output(self) -> None:
        """Read-only: take the output's upper and contents as the writing replica moves them."""
        upper = self.output.upper()
        if self.sink.output_progress.less_than(upper):
            self.contents = self.output.snapshot(upper)
            self._advance_output(upper)

    def _advance_output(self, upper: Frontier) -> None:
        """The output's upper is now `upper`: forget what is before it, hold the inputs there."""
        self.sink.output_progress = upper
        self.sink.to_append = [u for u in self.sink.to_append if upper.less_equal_time(u[1])]
        self.diffs = {t: d for t, d in self.diffs.items() if upper.less_equal_time(t)}
        self.sink.append_times = {t for t in self.sink.append_times if upper.less_equal_time(t)}
        if upper.time is not None:
            for input_name, pending in self.pending.items():
                self.pending[input_name] = pending.filter(
                    pc.greater_equal(pending.column(TIME), upper.time)
                )
        self._hold(upper)
        OUTPUT_UPPER.labels(self.definition.name).set(_time(upper))
        if self.report is not None:
            self.report(
                upper.time, None if self.read_only else self.sink.append_times_progress.time
            )

    def promote(self) -> None:
        """Start writing from the output's upper (a no-op for a writing replica)."""
        if self.read_only:
            self.read_only = False
            log.info(
                "continual task %s promoted: writing from output upper %s",
                self.definition.name,
                self.sink.output_progress,
            )

    def step(self) -> bool:
        """One round: poll, then work; whether anything happened. The leases are renewed here
        too (at most every third of their duration when nothing moves): the output can stand
        still for long, behind an idle input or a reference that is not final."""
        moved = self.poll()
        wrote = self.work()
        self._hold(self.sink.output_progress.join(self.start_at))
        return bool(wrote) or moved


def control_id(definition: Definition) -> str:
    """The id `mvsink promote` takes for a task: its control topic is `<id>.control`."""
    return f"ct.{definition.name}"


def _control(config: Config, definition: Definition) -> Reader:
    topic = Topics.for_sink(control_id(definition)).control
    ensure_topics(config.kafka_bootstrap, [TopicSpec(topic, 1)])
    log.info(
        "%s is read-only: following, writing nothing until `mvsink promote %s`",
        definition.name,
        control_id(definition),
    )
    return tail_consumer(config.kafka_bootstrap, topic)


def _promoted(control: Reader, definition: Definition, framing: Framing) -> bool:
    key = control_id(definition).encode()
    return any(
        isinstance(record, SinkControl) and not record.read_only and message.key() == key
        for message, record in drain(control, framing=framing)
    )


def _time(frontier: Frontier) -> float:
    return float("inf") if frontier.time is None else float(frontier.time)


def run(config: Config, stopping: Stopping) -> int:
    """The service body: one continual task (`[ct] task` / `MVSINK_CT_TASK`) until stopped."""
    from mvsink.io.spark import spark_session

    if not config.ct_task:
        raise ConfigError("no continual task: set [ct] task or MVSINK_CT_TASK to its definition")
    definition = load_definition(config.ct_task)
    probe_store(config, "ct")
    spark = spark_session(f"mvsink-ct-{definition.name}", shuffle_partitions=2, config=config)
    task = ContinualTask(
        definition,
        config.s3,
        config.shard_timing(),
        spark,
        writer_identity(config, "ct"),
        read_only=config.read_only,
        report=stopping.report,
    )
    task.start()
    control = _control(config, definition) if config.read_only else None
    framing = config.framing()
    try:
        while not stopping.stopped:
            if control is not None and _promoted(control, definition, framing):
                task.promote()
                control.close()
                control = None
            if not task.step():
                stopping.wait(task.timing.poll_interval * 4)
    finally:
        if control is not None:
            control.close()
    log.info(
        "%s stopped at output upper %s: %d times written, %d dropped, %d input bytes read",
        definition.name,
        task.sink.output_progress,
        task.times_written,
        task.times_dropped,
        task.bytes_read,
    )
    return 0
