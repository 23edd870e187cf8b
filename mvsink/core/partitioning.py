"""The desired partitioning: which of the P desired partitions an update belongs to.

Everything that partitions — the desired producer, `publish_dataframe`'s executors, the write
tasks reading back parts of another partitioning, the compactor — calls `partitions_of`, so
they agree by construction. Two functions exist, named by a version that travels with the data
(`UpdatesArrow.partitioning`, `Part.partitioning`; schemas/README.md):

* **1** — BLAKE2b-64 of the row's Avro binary encoding, big-endian, modulo P; an error update
  is keyed by `b"\\x00err:" + err`. Row by row in Python: too slow for the producer to keep up
  with the sink it feeds; kept for topics that already use it.
* **2** (the default) — a 64-bit hash of the row's column values computed on Arrow columns
  with numpy, modulo P: vectorised, no Python loop over rows. Defined below; its values are
  pinned in tests/unit/test_partitioning.py and must never change.

Version 2, exactly. All arithmetic is modulo 2^64 on unsigned 64-bit words, `mix` is the
SplitMix64 finalizer (`x ^= x >> 30; x *= 0xBF58476D1CE4E5B9; x ^= x >> 27;
x *= 0x94D049BB133111EB; x ^= x >> 31`).

* A column value's word `w`: a null is `NULL`; a boolean, integer, date (days) or timestamp
  (its integer in the column's unit) is `mix(v + INT)`, `v` the value as a two's-complement
  64-bit integer; a float is `mix(bits + FLOAT)`, `bits` the IEEE-754 binary64 of the value as
  a double, with -0.0 taken as 0.0 and every NaN as the canonical quiet NaN; a string (UTF-8) or
  binary value of `n` bytes starts as `w = mix(n + LENGTH)`, then for each 8-byte chunk `c` of
  its bytes in order (little-endian, the last one zero-padded) `w = mix(w ^ c)`.
* A row update's hash: `h = ROW`, then for each column in the row schema's order
  `h = mix(h ^ w)`.
* An error update's hash: `mix(ERROR ^ w)`, `w` the word of its error string.
* The partition: `h mod P`.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mvsink.core.errors import ContractError
from mvsink.core.rows import row_encoder

#: Partitioning functions a reader knows; new producers use `CURRENT`.
KNOWN = (1, 2)
CURRENT = 2

_U64 = np.uint64
NULL = _U64(0x6D7673696E6B0000)  # "mvsink\0\0"
INT = _U64(0x9E3779B97F4A7C15)
FLOAT = _U64(0xC2B2AE3D27D4EB4F)
LENGTH = _U64(0x165667B19E3779F9)
ROW = _U64(0x27D4EB2F165667C5)
ERROR = _U64(0x85EBCA77C2B2AE63)
_M1, _M2 = _U64(0xBF58476D1CE4E5B9), _U64(0x94D049BB133111EB)
_S27, _S30, _S31 = _U64(27), _U64(30), _U64(31)
_CANONICAL_NAN = np.array([np.nan], np.float64).view(np.uint64)[0]

_ERR_PREFIX = b"\x00err:"


def check_known(partitioning: int) -> None:
    """Raises `ContractError` for a partitioning function this reader does not know."""
    if partitioning not in KNOWN:
        raise ContractError(
            f"desired partitioning {partitioning} is unknown (this mvsink knows {KNOWN}): "
            "upgrade the reader before the producer"
        )


def mix(words: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on every word (a new array)."""
    x: np.ndarray = words ^ (words >> _S30)
    x *= _M1
    x ^= x >> _S27
    x *= _M2
    x ^= x >> _S31
    return x


def _bytes_words(array: pa.Array) -> np.ndarray:
    """The word of every value of a string/binary array (nulls: arbitrary), 8 bytes a step
    over all values at once: a value already past its end keeps its word."""
    wide = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    n = len(array)
    if n == 0:  # its offsets buffer may be empty (Arrow IPC)
        return np.zeros(0, _U64)
    _, offsets_buffer, data = array.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int64 if wide else np.int32)
    offsets = offsets[array.offset : array.offset + n + 1].astype(np.int64)
    lengths = np.diff(offsets)
    words = mix(lengths.astype(_U64) + LENGTH)
    first, size = int(offsets[0]), int(offsets[-1] - offsets[0])
    if size == 0:
        return words
    padded = np.zeros(size + 8, np.uint8)
    padded[:size] = np.frombuffer(data, np.uint8)[first : first + size]
    # Every byte position's little-endian 64-bit window (unaligned reads of the padded copy);
    # position `size` is all padding, where a value already past its end reads.
    windows = np.ndarray((size + 1,), "<u8", padded, strides=(1,))
    starts = offsets[:-1] - first
    for step in range(0, int(lengths.max()), 8):
        remaining = lengths - step
        chunk = windows[np.minimum(starts + step, size)]
        live = remaining > 0
        short = live & (remaining < 8)
        if short.any():  # zero the bytes past the value's end
            bits = np.where(short, remaining, 0).astype(_U64) * _U64(8)
            chunk &= np.where(short, (_U64(1) << bits) - _U64(1), ~_U64(0))
        mixed = mix(words ^ chunk)
        words = mixed if live.all() else np.where(live, mixed, words)
    return words


def _column_words(array: pa.Array) -> np.ndarray:
    """The word of every value of one column (one chunk)."""
    kind = array.type
    if (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    ):
        words = _bytes_words(array)
    elif pa.types.is_floating(kind):
        values = array.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False)
        bits = (values + 0.0).view(_U64)  # -0.0 + 0.0 is 0.0
        bits = np.where(np.isnan(values), _CANONICAL_NAN, bits)
        words = mix(bits + FLOAT)
    elif (
        pa.types.is_boolean(kind)
        or pa.types.is_integer(kind)
        or pa.types.is_date32(kind)
        or pa.types.is_timestamp(kind)
    ):
        as_int = array
        if pa.types.is_boolean(kind) or pa.types.is_date32(kind):
            as_int = array.cast(pa.int8() if pa.types.is_boolean(kind) else pa.int32())
        values = as_int.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        words = mix(values.view(_U64) + INT)
    else:
        raise ContractError(f"row column type {kind} has no partitioning word in mvsink")
    if array.null_count:
        valid = np.asarray(pc.is_valid(array).to_numpy(zero_copy_only=False))
        words = np.where(valid, words, NULL)
    return words


def split_by_partition(
    table: pa.Table, partitions: pa.Array, total: int
) -> list[tuple[int, pa.Table]]:
    """`(partition, its rows of table)` for every partition in `partitions` (one per row),
    in partition order; one sort, the rows of a partition keep their order."""
    order = pc.sort_indices(partitions)
    table = table.take(order)
    counts = np.bincount(partitions.to_numpy(zero_copy_only=False), minlength=total)
    out, start = [], 0
    for partition, count in enumerate(counts.tolist()):
        if count:
            out.append((partition, table.slice(start, count)))
        start += count
    return out


def _chunks(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def hashes_v2(table: pa.Table, schema: pa.Schema) -> np.ndarray:
    """The version-2 hash of every update of `table` (row columns of `schema` plus `_err`)."""
    h = np.full(table.num_rows, ROW, _U64)
    for name in schema.names:
        h = mix(h ^ _column_words(_chunks(table.column(name))))
    errors = _chunks(table.column("_err"))
    if errors.null_count < len(errors):
        is_error = np.asarray(pc.is_valid(errors).to_numpy(zero_copy_only=False))
        h = np.where(is_error, mix(ERROR ^ _bytes_words(errors)), h)
    return h


def partition_of(key: bytes, partitions: int) -> int:
    """Version 1: the desired partition of an Avro-encoded row (or `error_key`) under P."""
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def error_key(err: str) -> bytes:
    """Version 1: the partitioning key of an error update."""
    return _ERR_PREFIX + err.encode()


def partitions_of(
    table: pa.Table, schema: pa.Schema, partitions: int, partitioning: int = CURRENT
) -> pa.Array:
    """The desired partition (int32) of every update in `table` (row columns of `schema` plus
    `_err`) under P = `partitions` and function `partitioning`.

    Raises:
        ContractError: an unknown `partitioning`.
    """
    check_known(partitioning)
    if partitioning == 2:
        hashes = hashes_v2(table, schema) % _U64(partitions)
        return pa.array(hashes.astype(np.int32), pa.int32())
    return pa.array(
        [partition_of(key, partitions) for key in partition_keys(table, schema)], pa.int32()
    )


def partition_keys(table: pa.Table, schema: pa.Schema) -> list[bytes]:
    """The partitioning key of every update in `table` (row columns of `schema` plus `_err`):
    the Avro-encoded row, or `error_key(err)`. Encodes row by row."""
    encode = row_encoder(schema)
    rows = table.select(schema.names).to_pylist()
    errs = table.column("_err").to_pylist()
    return [
        error_key(err) if err is not None else encode(row)
        for row, err in zip(rows, errs, strict=True)
    ]
