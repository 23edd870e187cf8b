"""The correction buffer of one desired partition (port of the seed's `Correction`):
`corrections = desired - persist`, the updates still to be written so the shard equals desired.

Desired updates enter with their diffs (`insert`), updates read back from the shard with
negated diffs (`insert_negated`). Times before `since` (the shard's upper: those times are
final) are advanced to `since`, because anything still to be written must be written at or
after it. Everything is vectorised Arrow; nothing loops over rows in Python.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from mvsink.core.frontier import Frontier
from mvsink.core.updates import DIFF, TIME, consolidate, part_schema


class Correction:
    """`desired - persist` for one partition, in the part schema of `row_schema`."""

    def __init__(self, row_schema: pa.Schema, since: Frontier, table: pa.Table | None = None):
        self.row_schema = row_schema
        self.schema = part_schema(row_schema)
        self.since = since
        self._tables: list[pa.Table] = [] if table is None else [table]
        self._consolidated = table is not None

    def insert(self, updates: pa.Table) -> None:
        """Add desired updates (already in the part schema)."""
        if updates.num_rows:
            self._tables.append(self._advance(updates))
            self._consolidated = False

    def insert_negated(self, updates: pa.Table) -> None:
        """Subtract updates read back from the shard."""
        if updates.num_rows:
            self.insert(self._replace(updates, DIFF, pc.negate(updates.column(DIFF))))

    def retract_before(self, upper: Frontier) -> None:
        """Drop the updates with time before `upper`. Equal to `insert_negated` of a part
        staged from `updates_before(upper)` when nothing before `upper` changed since: what
        the read-back of our own appended part does, without reading or consolidating it."""
        if upper.time is None:
            self._tables, self._consolidated = [], True
            return
        self._tables = [
            t.filter(pc.greater_equal(t.column(TIME), upper.time)) for t in self._tables
        ]

    def advance_since(self, since: Frontier) -> None:
        """Advance times before `since` to `since` (never moves back)."""
        if not self.since.less_than(since):
            return
        self.since = since
        self._tables = [self._advance(t) for t in self._tables]
        self._consolidated = False

    def _advance(self, table: pa.Table) -> pa.Table:
        since = self.since.time
        if since is None or since == 0 or table.num_rows == 0:
            return table
        times = pc.max_element_wise(table.column(TIME), pa.scalar(since, pa.int64()))
        return self._replace(table, TIME, times)

    def _replace(self, table: pa.Table, name: str, column: pa.ChunkedArray) -> pa.Table:
        """`table` with column `name` replaced, in exactly the part schema."""
        columns = [
            column if field.name == name else table.column(field.name) for field in self.schema
        ]
        return pa.Table.from_arrays(columns, schema=self.schema)

    def consolidate(self) -> pa.Table:
        """Sum diffs per `(row, err, time)`, drop zeros; the consolidated contents."""
        if not self._consolidated:
            table = pa.concat_tables(self._tables) if self._tables else self.schema.empty_table()
            if table.num_rows:
                table = consolidate(table, self.row_schema)
            self._tables, self._consolidated = [table], True
        return self._tables[0]

    def updates_before(self, upper: Frontier) -> pa.Table:
        """The consolidated corrections with time before `upper` (what a batch must write):
        the consolidated table itself when all of it is (the usual case), so a task that keeps
        what it staged holds and saves (`services.write.checkpoint`) one copy, not two."""
        table = self.consolidate()
        if upper.time is None or table.num_rows == 0:
            return table
        if pc.max(table.column(TIME)).as_py() < upper.time:
            return table
        return table.filter(pc.less(table.column(TIME), upper.time))

    def __len__(self) -> int:
        return sum(t.num_rows for t in self._tables)
