"""Running a continual task's logic at one time on Spark: the statements of its `Definition` in
order over temp views of the inputs' changes, the references and the output, each statement
seeing the diffs the ones before it proposed (one iteration, as in the seed).

Collections go in and out as Arrow tables of the shard's part schema (row columns, `_time`,
`_diff`, `_err`); Spark sees a view's rows repeated by their multiplicity, so a query is
ordinary SQL over a bag of rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mvsink.core.errors import ContractError, InvalidUsage
from mvsink.core.frontier import Frontier
from mvsink.core.updates import DIFF, ERR, TIME, normalize_updates, part_schema
from mvsink.io.ct_definition import RETRACTIONS, Definition
from mvsink.shard import consolidate_at

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class LogicError(ContractError):
    """A statement failed or returned rows that do not fit the output."""


def expand(table: pa.Table, sign: int = 1) -> pa.Table:
    """The row columns of a part-schema `table`, each row repeated by its diff times `sign`
    (rows whose product is not positive left out): a bag of rows for SQL."""
    counts = table.column(DIFF).to_numpy() * sign
    keep = np.repeat(np.arange(table.num_rows), np.clip(counts, 0, None))
    return table.drop_columns([TIME, DIFF, ERR]).take(pa.array(keep, pa.int64()))


def with_diffs(rows: pa.Table, schema: pa.Schema, time: int, diff: int) -> pa.Table:
    """`rows` (row columns only) as updates at `time` with `diff` each, in the part schema."""
    n = rows.num_rows
    table = rows.append_column(TIME, pa.array(np.full(n, time), pa.int64()))
    table = table.append_column(DIFF, pa.array(np.full(n, diff), pa.int64()))
    return normalize_updates(table, schema)


def consolidate(table: pa.Table, schema: pa.Schema, time: int) -> pa.Table:
    """`table`'s updates at times `<= time` as a collection at `time` (diffs summed)."""
    return consolidate_at(table, schema, Frontier.at(time + 1))


def run_logic(
    spark: SparkSession,
    definition: Definition,
    time: int,
    changes: dict[str, pa.Table],
    references: dict[str, pa.Table],
    output: pa.Table,
) -> pa.Table:
    """The diffs the logic writes at `time`, consolidated (part schema, all at `time`).

    `changes`: each input's updates at `time`; `references`: each reference's contents as of
    `time`; `output`: the output's contents as of `time - 1`.

    Raises:
        LogicError: a statement failed, returned a different number of columns than the output
            has, values that do not cast to its types, or left a row of the output with a
            negative count.
    """
    schema = definition.output_schema
    for name, table in changes.items():
        _view(spark, name, expand(table))
        _view(spark, f"{name}{RETRACTIONS}", expand(table, -1))
    for name, table in references.items():
        _view(spark, name, expand(table))
    current = output
    proposed = part_schema(schema).empty_table()
    for number, statement in enumerate(definition.logic, 1):
        _view(spark, definition.output_name, _bag(current, time, statement.text))
        if statement.insert:
            query, diff = statement.query, 1
        else:
            query, diff = f"SELECT * FROM {definition.output_name} WHERE {statement.query}", -1
        try:
            rows = spark.sql(query, args={"time": time}).toArrow()
        except Exception as error:  # Spark's analysis and execution errors alike
            raise LogicError(
                f"statement {number} ({statement.text!r}) at time {time}: {_first_line(error)}"
            ) from error
        if rows.num_columns != len(schema):
            raise LogicError(
                f"statement {number} ({statement.text!r}) returns "
                f"{rows.num_columns} columns, the output has {len(schema)}: "
                f"{schema.names}"
            )
        rows = rows.rename_columns(schema.names)
        for field in schema:
            if not field.nullable and rows.column(field.name).null_count:
                raise LogicError(
                    f"statement {number} ({statement.text!r}) at time {time} "
                    f"returns NULL for {field.name}, which the output declares "
                    "not null"
                )
        try:
            diffs = with_diffs(rows, schema, time, diff)
        except InvalidUsage as error:
            raise LogicError(f"statement {number} ({statement.text!r}): {error}") from error
        proposed = consolidate(pa.concat_tables([proposed, diffs]), schema, time)
        current = consolidate(pa.concat_tables([output, proposed]), schema, time)
    _bag(current, time, "the logic")  # the result must be a collection
    return proposed


def _bag(collection: pa.Table, time: int, what: str) -> pa.Table:
    if collection.num_rows and pc.min(collection.column(DIFF)).as_py() < 0:
        raise LogicError(
            f"after {what!r} at time {time} the output holds a row a negative "
            "number of times: a DELETE retracted more than the output held"
        )
    return expand(collection)


def _view(spark: SparkSession, name: str, rows: pa.Table) -> None:
    spark.createDataFrame(rows).createOrReplaceTempView(name)


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
