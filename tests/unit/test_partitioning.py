"""The desired partitioning functions: pinned values (changing one would re-partition every
existing topic), version 2 against a one-value-at-a-time reading of its definition in the
module docs, independence from how the columns are chunked, and agreement across processes."""

from __future__ import annotations

import datetime
import json
import math
import os
import struct
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mvsink.core import partitioning
from mvsink.core.errors import ContractError
from mvsink.core.partitioning import error_key, hashes_v2, partition_of, partitions_of
from mvsink.core.rows import avro_row_schema, parse_row_schema, row_encoder
from mvsink.core.updates import normalize_updates

ROWS = parse_row_schema("k string, v long")
WIDE = parse_row_schema(
    "f double, d float, b bool, dt date, ts timestamp, bin binary, i int32, s string not null"
)
MASK = (1 << 64) - 1


def _table(rows: list[tuple[str | None, int | None]], err: list[str | None]) -> pa.Table:
    return normalize_updates(
        pa.table(
            {
                "k": pa.array([r[0] for r in rows], pa.string()),
                "v": pa.array([r[1] for r in rows], pa.int64()),
                "_time": pa.array([0] * len(rows), pa.int64()),
                "_diff": pa.array([1] * len(rows), pa.int64()),
                "_err": pa.array(err, pa.string()),
            }
        ),
        ROWS,
    )


# -- version 2 as its definition reads, one value at a time -------------------------------------


def _mix(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def _bytes_word(value: bytes) -> int:
    word = _mix((len(value) + int(partitioning.LENGTH)) & MASK)
    for start in range(0, len(value), 8):
        chunk = int.from_bytes(value[start : start + 8].ljust(8, b"\0"), "little")
        word = _mix(word ^ chunk)
    return word


def _word(value: object, kind: pa.DataType) -> int:
    if value is None:
        return int(partitioning.NULL)
    if pa.types.is_string(kind):
        return _bytes_word(str(value).encode())
    if pa.types.is_binary(kind):
        return _bytes_word(bytes(value))  # type: ignore[arg-type]
    if pa.types.is_floating(kind):
        number = float(value)  # type: ignore[arg-type]
        number = math.nan if math.isnan(number) else number + 0.0
        bits = struct.unpack("<Q", struct.pack("<d", number))[0]
        return _mix((bits + int(partitioning.FLOAT)) & MASK)
    if pa.types.is_date32(kind):
        value = (value - datetime.date(1970, 1, 1)).days  # type: ignore[operator]
    elif pa.types.is_timestamp(kind):
        delta = value - datetime.datetime(1970, 1, 1)  # type: ignore[operator]
        value = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return _mix((int(value) + int(partitioning.INT)) & MASK)  # type: ignore[call-overload]


def _reference(row: dict[str, object], err: str | None, schema: pa.Schema) -> int:
    if err is not None:
        return _mix(int(partitioning.ERROR) ^ _bytes_word(err.encode()))
    h = int(partitioning.ROW)
    for field in schema:
        h = _mix(h ^ _word(row[field.name], field.type))
    return h


def _wide_rows() -> st.SearchStrategy[list[dict[str, object]]]:
    floats = st.floats(allow_nan=True, allow_infinity=True)
    row = st.fixed_dictionaries(
        {
            "f": st.none() | floats,
            "d": st.none() | st.floats(width=32, allow_nan=True),
            "b": st.none() | st.booleans(),
            "dt": st.none() | st.dates(datetime.date(1900, 1, 1), datetime.date(2200, 1, 1)),
            "ts": st.none()
            | st.datetimes(datetime.datetime(1900, 1, 1), datetime.datetime(2200, 1, 1)),
            "bin": st.none() | st.binary(max_size=40),
            "i": st.none() | st.integers(-(2**31), 2**31 - 1),
            "s": st.text(max_size=30),
        }
    )
    return st.lists(row, max_size=25)


@settings(max_examples=150, deadline=None)
@given(
    rows=_wide_rows(),
    errors=st.lists(st.none() | st.text(max_size=20), max_size=25),
    start=st.integers(0, 5),
)
def test_v2_is_its_definition_for_every_column_type(
    rows: list[dict[str, object]], errors: list[str | None], start: int
) -> None:
    errs = (errors + [None] * len(rows))[: len(rows)]
    columns = {f.name: pa.array([r[f.name] for r in rows], f.type) for f in WIDE}
    table = pa.table({**columns, "_err": pa.array(errs, pa.string())})
    expected = [_reference(r, e, WIDE) for r, e in zip(rows, errs, strict=True)]
    assert hashes_v2(table, WIDE).tolist() == expected
    # A slice of a table (offsets into shared buffers) hashes the same values the same.
    assert hashes_v2(table.slice(start), WIDE).tolist() == expected[start:]
    # 64-bit offsets (large_string, large_binary) hash the same values the same.
    wide = {"s": pa.large_string(), "_err": pa.large_string(), "bin": pa.large_binary()}
    large = table.cast(pa.schema([f.with_type(wide.get(f.name, f.type)) for f in table.schema]))
    assert hashes_v2(large.slice(start), WIDE).tolist() == expected[start:]


@given(
    st.lists(st.tuples(st.text(max_size=20), st.integers(-(2**63), 2**63 - 1)), max_size=40),
    st.integers(1, 6),
    st.integers(1, 64),
)
def test_v2_does_not_depend_on_how_the_columns_are_chunked(
    rows: list[tuple[str, int]], cut: int, partitions: int
) -> None:
    whole = _table(list(rows), [None] * len(rows))
    batches = whole.to_batches(max_chunksize=cut)
    chunked = pa.Table.from_batches(batches, whole.schema) if batches else whole
    assert partitions_of(chunked, ROWS, partitions).equals(partitions_of(whole, ROWS, partitions))


def test_v2_pinned_values() -> None:
    table = _table(
        [
            ("a", 1),
            ("", 0),
            (None, None),
            ("abcdefgh", -1),
            ("abcdefghi", 2**62),
            ("ü" * 20, 7),
            (None, None),
        ],
        [None] * 6 + ["boom"],
    )
    assert [hex(h) for h in hashes_v2(table, ROWS).tolist()] == [
        "0x4515df9ede12faba",
        "0x94cd0c48be6c0b9a",
        "0xdffa720bb8a16cac",
        "0x24831a8db20d459f",
        "0xf9943710fbe5398d",
        "0x7188d6319fb1fd30",
        "0xfeca7ea47d61bd4d",
    ]
    assert partitions_of(table, ROWS, 7).to_pylist() == [5, 5, 4, 4, 2, 6, 2]
    assert partitions_of(table, ROWS, 1000).to_pylist() == [962, 530, 308, 783, 261, 584, 29]


def test_v2_spreads_keys_evenly() -> None:
    n = 80_000
    table = _table([(f"k{i:07d}", i) for i in range(n)], [None] * n)
    counts = np.bincount(partitions_of(table, ROWS, 8).to_numpy(), minlength=8)
    assert counts.min() > 0.95 * n / 8 and counts.max() < 1.05 * n / 8


def test_v1_is_blake2b_of_the_avro_row_and_pinned() -> None:
    encode = row_encoder(ROWS)
    encoded = encode({"k": "a", "v": 1})
    assert avro_row_schema(ROWS)["fields"][0] == {"name": "k", "type": ["null", "string"]}
    table = _table([("a", 1), (None, None)], [None, "x"])
    assert partitions_of(table, ROWS, 4, partitioning=1).to_pylist() == [
        partition_of(encoded, 4),
        partition_of(error_key("x"), 4),
    ]
    assert [partition_of(bytes([i]), 7) for i in range(5)] == [1, 5, 4, 4, 6]
    assert partition_of(encoded, 1000) == 206


def test_an_unknown_partitioning_is_refused() -> None:
    with pytest.raises(ContractError, match="partitioning 3 is unknown"):
        partitions_of(_table([("a", 1)], [None]), ROWS, 4, partitioning=3)


def test_v2_agrees_across_processes() -> None:
    """Nothing process-local (hash seeds, memory layout) enters the hash."""
    rows = [(f"key-{i}", i * 7919) for i in range(500)]
    here = partitions_of(_table(rows, [None] * len(rows)), ROWS, 13).to_pylist()
    script = (
        "import json, sys, pyarrow as pa\n"
        "from mvsink.core.partitioning import partitions_of\n"
        "from mvsink.core.rows import parse_row_schema\n"
        "rows = json.loads(sys.stdin.read())\n"
        "t = pa.table({'k': [r[0] for r in rows], 'v': pa.array([r[1] for r in rows], pa.int64()),"
        " '_err': pa.nulls(len(rows), pa.string())})\n"
        "print(json.dumps(partitions_of(t, parse_row_schema('k string, v long'), 13).to_pylist()))\n"
    )
    there = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(rows),
        text=True,
        capture_output=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    assert json.loads(there.stdout) == here
