"""DesiredRecord v2 `UpdatesArrow`: the Arrow IPC payload round-trips through the codec, and
every payload that does not fit the sink's rows is a `DecodeError` (quarantined, never folded)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from mvsink.core import codec
from mvsink.core.errors import ContractError, DecodeError
from mvsink.core.messages import UpdatesArrow
from mvsink.core.rows import parse_row_schema
from mvsink.core.updates import (
    MAX_RECORD_BYTES,
    describe_ipc,
    ipc_decoded_size,
    normalize_updates,
    updates_from_ipc,
    updates_to_ipc,
)

SCHEMA = parse_row_schema("key string not null, value long")


def _table(**columns: list[object]) -> pa.Table:
    base: dict[str, list[object]] = {
        "key": ["a", "b"],
        "value": [1, None],
        "_time": [3, 4],
        "_diff": [1, -2],
    }
    base.update(columns)
    return pa.table(base)


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_round_trip_through_the_codec(compression: str | None) -> None:
    table = normalize_updates(_table(), SCHEMA)
    record = UpdatesArrow(updates_to_ipc(table, compression))
    decoded = codec.decode(codec.encode(record), UpdatesArrow)
    assert isinstance(decoded, UpdatesArrow)
    assert updates_from_ipc(decoded.ipc, SCHEMA).equals(table)
    assert "2 rows" in repr(decoded) and "'key': 'a'" in repr(decoded)


def test_error_updates_may_leave_row_columns_null() -> None:
    table = _table(key=["a", None], _err=[None, "boom"])
    decoded = updates_from_ipc(updates_to_ipc(table), SCHEMA)
    assert decoded.column("_err").to_pylist() == [None, "boom"]


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"not arrow at all", "not an Arrow IPC stream"),
        (updates_to_ipc(pa.table({"key": ["a"], "_time": [1], "_diff": [1]})), "lack column"),
        (updates_to_ipc(_table(value=["x", "y"])), "is not int64"),
        (updates_to_ipc(_table(_diff=[1, 0])), "zero _diff"),
        (updates_to_ipc(_table(_time=[-1, 2])), "outside"),
        (updates_to_ipc(_table(_time=[None, 2])), "null _time"),
        (updates_to_ipc(_table(key=["a", None])), "null 'key'"),
        (updates_to_ipc(_table(extra=["x", "y"])), r"columns the sink's rows do not: \['extra'\]"),
        (
            updates_to_ipc(
                pa.Table.from_arrays(
                    [pa.array(["a"]), pa.array(["b"]), pa.array([1]), pa.array([1])],
                    names=["key", "key", "_time", "_diff"],
                )
            ),
            r"more than once: \['key'\]",
        ),
    ],
    ids=[
        "garbage",
        "missing-column",
        "wrong-type",
        "zero-diff",
        "negative-time",
        "null-time",
        "null-key",
        "extra-column",
        "duplicate-column",
    ],
)
def test_payloads_that_do_not_fit_are_decode_errors(payload: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match=reason):
        updates_from_ipc(payload, SCHEMA)


def test_inspect_summary_never_raises() -> None:
    assert "not Arrow IPC" in describe_ipc(b"junk")


def test_empty_payload_is_rejected() -> None:
    with pytest.raises(ContractError):
        UpdatesArrow(b"")


def test_whatever_reading_a_payload_raises_is_a_decode_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A decompression bomb (`MemoryError`) or any other failure of the reader is the record's
    fault: a `DecodeError` (quarantined), never an error that fails the step at the same
    offset forever."""

    def bomb(_: object) -> object:
        raise MemoryError("a decompression bomb")

    payload = updates_to_ipc(normalize_updates(_table(), SCHEMA))
    monkeypatch.setattr(pa.ipc, "open_stream", bomb)
    with pytest.raises(DecodeError, match="decompression bomb"):
        updates_from_ipc(payload, SCHEMA)


def test_every_failure_to_decode_a_desired_record_is_a_decode_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mvsink.core.rows import updates_decoder
    from mvsink.io.registry import OWN
    from mvsink.upstream import desired

    record = UpdatesArrow(updates_to_ipc(normalize_updates(_table(), SCHEMA)))

    class Message:
        def value(self) -> bytes:
            return codec.encode(record)

    def broken(*_: object) -> object:
        raise KeyError("key")

    monkeypatch.setattr(desired, "updates_from_ipc", broken)
    with pytest.raises(DecodeError, match="does not decode: KeyError"):
        desired.decode_desired(Message(), SCHEMA, updates_decoder(SCHEMA), None, OWN)  # type: ignore[arg-type]


def _stream(table: pa.Table, compression: str | None, batches: int = 1) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        step = -(-table.num_rows // batches)
        for start in range(0, table.num_rows, step):
            writer.write_table(table.slice(start, step))
    return bytes(sink.getvalue())


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
@pytest.mark.parametrize("batches", [1, 3])
def test_the_decoded_size_is_read_from_the_metadata_without_decoding(
    compression: str | None, batches: int
) -> None:
    """Rows and bytes from the messages' metadata, dictionary batches and nulls included, as
    large as the batches Arrow then decodes (their buffers, padded to 8 bytes)."""
    n = 30_000
    table = pa.table(
        {
            "key": pa.array([f"k{i % 7}" for i in range(n)]).dictionary_encode(),
            "value": pa.array([None if i % 3 else i for i in range(n)], pa.int64()),
            "_time": pa.array([5] * n, pa.int64()),
        }
    )
    payload = _stream(table, compression, batches)
    rows, size = ipc_decoded_size(payload)
    decoded = pa.ipc.open_stream(payload).read_all()
    assert rows == n + 7  # the dictionary's rows count too
    # each chunk of the table counts the dictionary again; the stream holds it once
    assert abs(size - decoded.nbytes) <= 0.001 * decoded.nbytes, (size, decoded.nbytes)


def test_a_decompression_bomb_is_refused_before_anything_is_decompressed() -> None:
    """A few kilobytes of zstd standing for 320 MB of zeros: refused naming its sizes and the
    setting, with nothing allocated for it; the same payload under a larger limit decodes."""
    import numpy as np

    zeros = pa.table({"_time": pa.array(np.zeros(40_000_000, dtype=np.int64))})
    bomb = _stream(zeros, "zstd")
    del zeros
    assert len(bomb) < 100_000
    before = pa.total_allocated_bytes()
    with pytest.raises(DecodeError, match=r"decodes to 320,000,000 bytes \(40,000,000 rows\)"):
        updates_from_ipc(bomb, SCHEMA)
    assert pa.total_allocated_bytes() - before < 1_000_000
    assert describe_ipc(bomb) == (
        f"<{len(bomb):,} bytes decoding to 320,000,000 bytes (40,000,000 rows): not decoded>"
    )
    assert MAX_RECORD_BYTES < 320_000_000
    with pytest.raises(DecodeError, match="max_record_bytes"):
        updates_from_ipc(bomb, SCHEMA, max_bytes=100)
    # under a limit it passes the size check, and fails only on what it is (no key column)
    with pytest.raises(DecodeError, match="does not fit the sink's rows"):
        updates_from_ipc(bomb, SCHEMA, max_bytes=400_000_000)


@pytest.mark.parametrize("cut", ["truncated", "garbage"])
def test_metadata_that_does_not_parse_is_a_decode_error(cut: str) -> None:
    payload = updates_to_ipc(normalize_updates(_table(), SCHEMA))
    payload = payload[: len(payload) // 2] if cut == "truncated" else b"\xff" * 4 + b"\x10" * 20
    with pytest.raises(DecodeError, match="not an Arrow IPC stream"):
        ipc_decoded_size(payload)
