"""DesiredRecord v2 `UpdatesArrow`: the Arrow IPC payload round-trips through the codec, and
every payload that does not fit the sink's rows is a `DecodeError` (quarantined, never folded)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from mvsink.core import codec
from mvsink.core.errors import ContractError, DecodeError
from mvsink.core.messages import UpdatesArrow
from mvsink.core.rows import parse_row_schema
from mvsink.core.updates import describe_ipc, normalize_updates, updates_from_ipc, updates_to_ipc

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

    monkeypatch.setattr(pa.ipc, "open_stream", bomb)
    with pytest.raises(DecodeError, match="decompression bomb"):
        updates_from_ipc(b"anything", SCHEMA)


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
