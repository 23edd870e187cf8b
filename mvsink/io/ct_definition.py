"""A continual task's definition: a small TOML file, validated before anything runs.

```toml
name = "latest_order"          # the task's id: in leases, part keys, logs and metrics
as_of = 0                      # optional: the first time the task may write at (default 0)
snapshot = false               # optional: whether the first run sees the inputs' contents
                               # before `as_of` as changes at `as_of` (default false)
logic = [                      # Spark SQL, run in order at every time an input changed at
  "DELETE FROM latest WHERE customer IN (SELECT customer FROM orders)",
  "INSERT INTO latest SELECT customer, max(order_id), max_by(amount, order_id) FROM orders GROUP BY customer",
]

[inputs]                       # name in the SQL = shard id: read as its changes at the time
orders = "demo-orders"

[references]                   # optional, name = shard id: read as of the time
# customers = "demo-customers"

[output]
name = "latest"                # the output's name in the SQL: its contents as of time - 1
shard = "ct-latest-order"
schema = "customer string not null, order_id long not null, amount long not null"
```

Shard ids may name an environment variable, `${NAME}` or `${NAME:-default}` (a deployment's
`MVSINK_SHARD_ID`, say); an unset one without a default is refused.

The logic is an ordered list of statements, each either
`INSERT INTO <output> <query>` (the query's rows, by position, are added at the time) or
`DELETE FROM <output> [WHERE <condition>]` (every row of the output matching the condition is
retracted at the time). Each statement sees the output as of the previous time with the diffs
the statements before it proposed (one iteration, as in the seed). In every statement an input's
name holds the rows the input inserted at the time, `<input>_retractions` the rows it retracted;
a reference's name holds its contents as of the time; the parameter marker `:time` is the time.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from mvsink.core.errors import ConfigError
from mvsink.core.rows import parse_row_schema
from mvsink.io.config import ID, read_toml

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_INSERT = re.compile(
    r"^\s*INSERT\s+INTO\s+([A-Za-z_][A-Za-z0-9_]*)\s+(.+?)\s*;?\s*$", re.IGNORECASE | re.DOTALL
)
_DELETE = re.compile(
    r"^\s*DELETE\s+FROM\s+([A-Za-z_][A-Za-z0-9_]*)(?:\s+WHERE\s+(.+?))?\s*;?\s*$",
    re.IGNORECASE | re.DOTALL,
)
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_TOP = {"name", "as_of", "snapshot", "logic", "inputs", "references", "output"}
RETRACTIONS = "_retractions"


@dataclass(frozen=True)
class Statement:
    """One step of the logic: `insert` the rows of `query`, or delete the output's rows
    matching `query` (a condition; `TRUE` when the statement has no WHERE)."""

    insert: bool
    query: str
    text: str


@dataclass(frozen=True)
class Definition:
    """A validated continual task."""

    name: str
    inputs: dict[str, str]
    references: dict[str, str]
    output_name: str
    output_shard: str
    output_schema: pa.Schema
    logic: tuple[Statement, ...]
    as_of: int = 0
    snapshot: bool = False

    def shards(self) -> dict[str, str]:
        """SQL name -> shard id of every shard the task reads (not its output)."""
        return {**self.inputs, **self.references}


def parse_statement(text: str, output: str) -> Statement:
    """A statement of the logic, or a `ConfigError` saying what is accepted."""
    if (found := _INSERT.match(text)) is not None:
        target, query = found.group(1), found.group(2)
        insert = True
    elif (found := _DELETE.match(text)) is not None:
        target, query = found.group(1), found.group(2) or "TRUE"
        insert = False
    else:
        raise ConfigError(
            f"logic statement {text!r}: use INSERT INTO {output} <query> or "
            f"DELETE FROM {output} [WHERE <condition>]"
        )
    if target != output:
        raise ConfigError(
            f"logic statement {text!r} writes {target!r}: a continual task writes "
            f"only its output, {output!r}"
        )
    return Statement(insert, query, text.strip())


def expand_variables(value: str, origin: str, env: Mapping[str, str] | None = None) -> str:
    """`value` with every `${NAME}` / `${NAME:-default}` replaced from the environment."""
    env = os.environ if env is None else env

    def one(found: re.Match[str]) -> str:
        name, default = found.group(1), found.group(2)
        if name in env:
            return env[name]
        if default is None:
            raise ConfigError(f"{origin}: {value!r} names ${{{name}}}, which is not set")
        return default

    return _VARIABLE.sub(one, value)


def definition_from_toml(
    raw: dict[str, Any], origin: str = "the definition", env: Mapping[str, str] | None = None
) -> Definition:
    """Validate a parsed TOML definition (see the module docs); `ConfigError` names the key.
    Shard ids are expanded from `env` (default: the process environment)."""
    unknown = set(raw) - _TOP
    if unknown:
        raise ConfigError(f"{origin}: unknown keys {sorted(unknown)} (known: {sorted(_TOP)})")
    name = _text(raw, "name", origin)
    if not ID.match(name):
        raise ConfigError(f"{origin}: name={name!r}: use 1-200 of [A-Za-z0-9_.-]")
    output = raw.get("output")
    if not isinstance(output, dict) or set(output) != {"name", "shard", "schema"}:
        raise ConfigError(f"{origin}: [output] needs exactly name, shard and schema")
    output_name = _text(output, "name", f"{origin} [output]")
    output_shard = expand_variables(_text(output, "shard", f"{origin} [output]"), origin, env)
    try:
        schema = parse_row_schema(_text(output, "schema", f"{origin} [output]"))
    except ConfigError as error:
        raise ConfigError(f"{origin}: [output] schema: {error}") from error
    inputs = _shards(raw.get("inputs"), "inputs", origin, env)
    if not inputs:
        raise ConfigError(f'{origin}: [inputs] needs at least one `name = "shard id"`')
    references = _shards(raw.get("references", {}), "references", origin, env)
    names = [output_name, *inputs, *references]
    names += [f"{n}{RETRACTIONS}" for n in inputs]
    for sql_name in names:
        if not _NAME.match(sql_name):
            raise ConfigError(f"{origin}: {sql_name!r} is not a SQL name ([A-Za-z_][A-Za-z0-9_]*)")
    if len({n.lower() for n in names}) != len(names):
        raise ConfigError(
            f"{origin}: the names of the output, inputs, references and "
            f"<input>{RETRACTIONS} must differ: {names}"
        )
    if not ID.match(output_shard) or output_shard in {*inputs.values(), *references.values()}:
        raise ConfigError(
            f"{origin}: output shard {output_shard!r} must be a valid id other "
            f"than the inputs' and references' (the output is read as "
            f"{output_name!r} already)"
        )
    logic = raw.get("logic")
    if not isinstance(logic, list) or not logic or not all(isinstance(s, str) for s in logic):
        raise ConfigError(f"{origin}: logic must be a non-empty list of SQL statements")
    as_of, snapshot = raw.get("as_of", 0), raw.get("snapshot", False)
    if not isinstance(as_of, int) or isinstance(as_of, bool) or as_of < 0:
        raise ConfigError(f"{origin}: as_of must be an integer >= 0, got {as_of!r}")
    if not isinstance(snapshot, bool):
        raise ConfigError(f"{origin}: snapshot must be true or false, got {snapshot!r}")
    try:
        statements = tuple(parse_statement(s, output_name) for s in logic)
    except ConfigError as error:
        raise ConfigError(f"{origin}: {error}") from error
    return Definition(
        name, inputs, references, output_name, output_shard, schema, statements, as_of, snapshot
    )


def load_definition(path: str | Path) -> Definition:
    """Read and validate the definition file at `path`."""
    file = Path(path)
    return definition_from_toml(read_toml(file, "continual task definition"), str(file))


def _text(table: dict[str, Any], key: str, origin: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{origin}: {key} must be a non-empty string")
    return value.strip()


def _shards(table: object, key: str, origin: str, env: Mapping[str, str] | None) -> dict[str, str]:
    if not isinstance(table, dict):
        raise ConfigError(f'{origin}: [{key}] must be a table of `name = "shard id"`')
    shards = {}
    for name, value in table.items():
        shard_id = expand_variables(value, origin, env) if isinstance(value, str) else value
        if not isinstance(shard_id, str) or not ID.match(shard_id):
            raise ConfigError(f"{origin}: [{key}] {name} = {shard_id!r} is not a shard id")
        shards[name] = shard_id
    return shards
