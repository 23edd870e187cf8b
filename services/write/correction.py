"""The correction buffer of one desired partition (port of the seed's `Correction`):
`corrections = desired - persist`, the updates still to be written so the shard equals desired.

Desired updates enter with their diffs (`insert`), updates read back from the shard with
negated diffs (`insert_negated`). Times before `since` (the shard's upper: those times are
final) are advanced to `since`, because anything still to be written must be written at or
after it. Everything is vectorised Arrow; nothing loops over rows in Python.

Consolidating is a hash group-by over every row, the largest cost of a step. It is needed where
the contents can cancel: updates read back from the shard against desired ones, times advanced
to `since`, a previous consolidation's leftovers against new updates. Desired updates as
received, at their own times, with nothing else pending, cancel only where the upstream's own
changelog does (an update and its retraction at one time): they are kept as received, and a
part staged from them is the upstream's changelog as published. The steady state is that case
(the read-back of the previous part dropped it, `retract_before`), and so is a first load.
Every reader of the shard consolidates (`Shard.snapshot`, merges, the write task's own fold),
so such a part changes no contents; a merge consolidates it. See docs/decisions.md.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from mvsink.core.frontier import Frontier
from mvsink.core.updates import DIFF, TIME, consolidate, part_schema

#: What a table of the contents is: a consolidation's output or a loaded checkpoint (kept as it
#: is alone, consolidated with anything else), desired updates as received at their own times,
#: or anything else (read back, advanced).
CONSOLIDATED, RECEIVED, MIXED = "consolidated", "received", "mixed"
#: Chunks past which received tables kept as they are are combined into one, if they average
#: fewer than `MIN_CHUNK_ROWS` rows: a stalled shard keeps them across steps, and every kernel,
#: pickle and checkpoint pays per chunk. Chunks as large as a desired record (up to 20k
#: updates, `mvsink.upstream.producer.CHUNK`) cost nothing per chunk worth a copy of them all
#: (a hydration folds hundreds of them).
MAX_CHUNKS = 64
MIN_CHUNK_ROWS = 4096


class Correction:
    """`desired - persist` for one partition, in the part schema of `row_schema`."""

    def __init__(self, row_schema: pa.Schema, since: Frontier, table: pa.Table | None = None):
        self.row_schema = row_schema
        self.schema = part_schema(row_schema)
        self.since = since
        self._tables: list[pa.Table] = [] if table is None else [table]
        #: What each of `_tables` is (`CONSOLIDATED`, `RECEIVED`, `MIXED`).
        self._kinds: list[str] = [] if table is None else [CONSOLIDATED]
        self._consolidated = table is not None

    def insert(self, updates: pa.Table) -> None:
        """Add desired updates (already in the part schema)."""
        self._add(updates, RECEIVED)

    def insert_negated(self, updates: pa.Table) -> None:
        """Subtract updates read back from the shard."""
        if updates.num_rows:
            self._add(self._replace(updates, DIFF, pc.negate(updates.column(DIFF))), MIXED)

    def _add(self, updates: pa.Table, kind: str) -> None:
        if updates.num_rows:
            advanced, moved = self._advance(updates)
            self._tables.append(advanced)
            self._kinds.append(MIXED if moved else kind)
            self._consolidated = False

    def retract_before(self, upper: Frontier) -> None:
        """Drop the updates with time before `upper`. Equal to `insert_negated` of a part
        staged from `updates_before(upper)` when nothing before `upper` changed since: what
        the read-back of our own appended part does, without reading or consolidating it."""
        if upper.time is None:
            self._tables, self._kinds = [self.schema.empty_table()], [CONSOLIDATED]
            self._consolidated = True
            return
        self._tables = [
            t.filter(pc.greater_equal(t.column(TIME), upper.time)) for t in self._tables
        ]

    def advance_since(self, since: Frontier) -> None:
        """Advance times before `since` to `since` (never moves back)."""
        if not self.since.less_than(since):
            return
        self.since = since
        for i, table in enumerate(self._tables):
            self._tables[i], moved = self._advance(table)
            if moved:
                self._kinds[i] = MIXED
                self._consolidated = False

    def _advance(self, table: pa.Table) -> tuple[pa.Table, bool]:
        """`table` with its times before `since` advanced, and whether any was."""
        since = self.since.time
        if since is None or since == 0 or table.num_rows == 0:
            return table, False
        if pc.min(table.column(TIME)).as_py() >= since:
            return table, False
        times = pc.max_element_wise(table.column(TIME), pa.scalar(since, pa.int64()))
        return self._replace(table, TIME, times), True

    def _replace(self, table: pa.Table, name: str, column: pa.ChunkedArray) -> pa.Table:
        """`table` with column `name` replaced, in exactly the part schema."""
        columns = [
            column if field.name == name else table.column(field.name) for field in self.schema
        ]
        return pa.Table.from_arrays(columns, schema=self.schema)

    def consolidate(self) -> pa.Table:
        """The contents as one table: diffs summed per `(row, err, time)` and zeros dropped,
        except that desired updates as received with nothing else pending, or a consolidated
        table alone, are kept as they are (module docs)."""
        if not self._consolidated:
            pending = [(t, k) for t, k in zip(self._tables, self._kinds, strict=True) if t.num_rows]
            kinds = {k for _, k in pending}
            if not pending:
                table, kind = self.schema.empty_table(), CONSOLIDATED
            elif kinds == {RECEIVED} or (len(pending) == 1 and kinds == {CONSOLIDATED}):
                table, kind = pa.concat_tables([t for t, _ in pending]), kinds.pop()
                chunks = table.column(0).num_chunks
                if chunks > MAX_CHUNKS and table.num_rows < MIN_CHUNK_ROWS * chunks:
                    table = table.combine_chunks()
            else:
                table = consolidate(pa.concat_tables([t for t, _ in pending]), self.row_schema)
                kind = CONSOLIDATED
            self._tables, self._kinds, self._consolidated = [table], [kind], True
        return self._tables[0]

    def updates_before(self, upper: Frontier) -> pa.Table:
        """The corrections (`consolidate()`) with time before `upper` (what a batch must write):
        that table itself when all of it is (the usual case), so a task that keeps
        what it staged holds and saves (`services.write.checkpoint`) one copy, not two."""
        table = self.consolidate()
        if upper.time is None or table.num_rows == 0:
            return table
        if pc.max(table.column(TIME)).as_py() < upper.time:
            return table
        return table.filter(pc.less(table.column(TIME), upper.time))

    def __len__(self) -> int:
        return sum(t.num_rows for t in self._tables)
