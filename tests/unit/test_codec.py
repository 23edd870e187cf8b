"""Contracts: messages validate on construction, codecs round-trip, old versions stay readable,
and undecodable bytes give a clear, located error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mvsink.core import codec
from mvsink.core.errors import ContractError, DecodeError
from mvsink.core.frontier import MAX_TIME, Frontier
from mvsink.core.messages import (
    BatchDescription,
    BatchId,
    DesiredProgress,
    Part,
    Progress,
    Record,
    ShardUpper,
    SinkControl,
    SinkDefinition,
    StagedBatch,
    Update,
    Updates,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "compat"

times = st.integers(0, MAX_TIME)
frontiers = st.one_of(st.just(Frontier.empty()), times.map(Frontier.at))
ids = st.text(alphabet="abcxyz-_.09", min_size=1, max_size=12)
diffs = st.integers(-(2**63), 2**63 - 1).filter(bool)
batch_ids = st.builds(BatchId, times, times)


@st.composite
def bounds(draw: st.DrawFn) -> tuple[Frontier, Frontier]:
    lower = draw(st.integers(0, MAX_TIME - 1))
    upper = draw(st.one_of(st.just(None), st.integers(lower + 1, MAX_TIME)))
    return Frontier.at(lower), Frontier.empty() if upper is None else Frontier.at(upper)


updates = st.one_of(
    st.builds(Update.ok, st.binary(max_size=20), times, diffs),
    st.builds(Update.error, st.text(max_size=20), times, diffs),
)


@st.composite
def staged_batches(draw: st.DrawFn) -> StagedBatch:
    lower, upper = draw(bounds())
    covers = tuple(draw(st.sets(st.integers(0, 63), max_size=6)))
    parts = tuple(
        Part(
            f"shards/s/parts/w/{i}.parquet",
            p,
            64,
            draw(st.integers(0, 10**9)),
            draw(st.integers(0, 10**9)),
        )
        for i, p in enumerate(covers)
    )
    foreign = Part("shards/s/parts/x/f.parquet", None, None, 1, 1)
    return StagedBatch(
        draw(batch_ids),
        lower,
        upper,
        covers,
        parts + ((foreign,) if draw(st.booleans()) else ()),
        draw(ids),
    )


@st.composite
def descriptions(draw: st.DrawFn) -> BatchDescription:
    lower, upper = draw(bounds())
    return BatchDescription(
        draw(ids), draw(batch_ids), lower, upper, draw(st.integers(0, 2**31 - 1))
    )


records = st.one_of(
    st.lists(updates, max_size=5).map(lambda us: Updates(tuple(us))),
    frontiers.map(Progress),
    st.builds(DesiredProgress, ids, st.integers(0, 2**31 - 1), frontiers),
    st.builds(ShardUpper, ids, frontiers, times),
    descriptions(),
    staged_batches(),
    st.builds(SinkControl, st.booleans()),
    st.builds(
        SinkDefinition,
        ids,
        ids,
        st.integers(1, 2**31 - 1),
        st.integers(1, 2**31 - 1),
        st.integers(1, 2),
        times,
        times,
        ids,
        st.text(),
        st.text(),
        st.integers(0, 2**62),
        st.booleans(),
    ),
)


@given(records)
def test_round_trip(record: Record) -> None:
    data = codec.encode(record)
    assert data[0] == codec.MAGIC
    assert codec.decode(data) == record
    assert codec.decode(data, expect=type(record)) == record


# -- validation on construction ------------------------------------------------------------------


def definition(**changes: Any) -> SinkDefinition:
    fields = dict(
        sink_id="s",
        shard_id="s",
        partitions=2,
        append_workers=2,
        partitioning=2,
        as_of=0,
        retain_history=0,
        frontiers_topic="frontiers",
        row_schema="",
        defined_by="h:1",
        at_ms=0,
    )
    return SinkDefinition(**{**fields, **changes})


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: BatchDescription("s", BatchId(0, 0), Frontier.at(5), Frontier.at(5), 0),
            "not less than",
        ),
        (
            lambda: BatchDescription("s", BatchId(0, 0), Frontier.at(6), Frontier.at(5), 0),
            "not less than",
        ),
        (
            lambda: BatchDescription("s", BatchId(0, 0), Frontier.empty(), Frontier.empty(), 0),
            "lower is the empty",
        ),
        (lambda: BatchDescription("", BatchId(0, 0), Frontier.at(0), Frontier.at(1), 0), "sink_id"),
        (
            lambda: BatchDescription("s", BatchId(0, 0), Frontier.at(0), Frontier.at(1), -1),
            "append_worker",
        ),
        (
            lambda: StagedBatch(BatchId(0, 0), Frontier.at(2), Frontier.at(1), (), (), "w"),
            "not less than",
        ),
        (
            lambda: StagedBatch(BatchId(0, 0), Frontier.at(0), Frontier.at(1), (1, 1), (), "w"),
            "duplicates",
        ),
        (
            lambda: StagedBatch(
                BatchId(0, 0), Frontier.at(0), Frontier.at(1), (0,), (Part("k", 1, 2, 0, 0),), "w"
            ),
            "not in covers",
        ),
        (lambda: Part("k", 2, 2, 0, 0), "out of range"),
        (lambda: Part("k", 0, None, 0, 0), "partition"),
        (lambda: Part("k", None, None, -1, 0), "updates"),
        (lambda: Update(b"r", "e", 0, 1), "exactly one"),
        (lambda: Update(None, None, 0, 1), "exactly one"),
        (lambda: Update(b"r", None, -1, 1), "time"),
        (lambda: Update(b"r", None, 0, 0), "diff"),
        (lambda: DesiredProgress("s", -1, Frontier.at(0)), "partition"),
        (lambda: ShardUpper("s", Frontier.at(0), -1), "seqno"),
        (lambda: BatchId(-1, 0), "epoch"),
        (lambda: SinkControl(read_only=1), "bool"),  # type: ignore[arg-type]
        (lambda: definition(partitions=0), "partitions"),
        (lambda: definition(append_workers=2**31), "append_workers"),
        (lambda: definition(shard_id=""), "ids"),
        (lambda: definition(frontiers_topic=""), "frontiers_topic"),
        (lambda: definition(as_of=-1), "as_of"),
        (lambda: definition(partitioning=0), "partitioning"),
        (lambda: definition(retain_history=-1), "retain_history"),
        (lambda: definition(dropped=1), "dropped"),
    ],
)
def test_invalid_messages_are_rejected(make: Any, message: str) -> None:
    with pytest.raises(ContractError, match=message):
        make()


# -- decode errors ----------------------------------------------------------------------------


def _frame(kind: str, datum: Any) -> bytes:
    return codec.encode_datum(kind, datum, codec.latest(kind))


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "not an mvsink record"),
        (b"\x00\x04\x01", "not an mvsink record"),
        (bytes((codec.MAGIC, 99, 1)), "unknown record kind id 99"),
        (bytes((codec.MAGIC, 4, 99)), "version 99 is unknown"),
        (bytes((codec.MAGIC, 4, 1)) + b"\x02", "invalid Avro"),
        (codec.encode(SinkControl(True)) + b"\x00", "trailing bytes"),
        (
            _frame(
                "BatchDescription",
                {
                    "sink_id": "s",
                    "id": {"epoch": 0, "seq": 0},
                    "lower": [3],
                    "upper": [3],
                    "append_worker": 0,
                },
            ),
            "not less than",
        ),
        (_frame("ShardUpper", {"shard_id": "s", "upper": [1, 2], "seqno": 0}), "at most one"),
    ],
)
def test_undecodable_bytes_raise_decode_error(data: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match=reason):
        codec.decode(data)


def test_unexpected_record_type_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="expected BatchDescription, got SinkControl"):
        codec.decode(codec.encode(SinkControl(False)), expect=BatchDescription)


class FakeMessage:
    """A stand-in for `confluent_kafka.Message` (which cannot be constructed with a position)."""

    def __init__(self, value: bytes | None) -> None:
        self._value = value

    def value(self) -> bytes | None:
        return self._value

    def topic(self) -> str:
        return "demo.descs"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 17


@pytest.mark.parametrize("value", [b"garbage", None])
def test_decode_message_names_topic_partition_offset(value: bytes | None) -> None:
    with pytest.raises(DecodeError) as caught:
        codec.decode_message(FakeMessage(value))
    error = caught.value
    assert (error.topic, error.partition, error.offset) == ("demo.descs", 0, 17)
    assert "topic=demo.descs partition=0 offset=17" in str(error)


def test_schema_header() -> None:
    assert codec.schema_header(ShardUpper("s", Frontier.at(1), 0)) == "ShardUpper/v1"
    assert codec.schema_header(Progress(Frontier.at(1))) == "DesiredRecord/v3"


# -- compatibility across schema versions -------------------------------------------------------


def _versions() -> list[codec.SchemaVersion]:
    return [v for kind in codec.KINDS.values() for v in codec.schema_versions(kind)]


@pytest.mark.parametrize("version", _versions(), ids=lambda v: f"{v.kind}/v{v.version}")
def test_current_reader_reads_every_kept_version(version: codec.SchemaVersion) -> None:
    """Each released schema version keeps an example datum in tests/compat/<Kind>/vN.json with
    the record the *current* reader must decode it to; written with that old schema, it must
    decode to exactly that record."""
    example_path = EXAMPLES / version.kind / f"v{version.version}.json"
    assert example_path.exists(), f"keep an example for {version.kind}/v{version.version}"
    example = json.loads(example_path.read_text())
    for case in example["cases"]:
        datum = _from_json(case["datum"])
        data = codec.encode_datum(version.kind, datum, version)
        decoded = codec.decode(data)
        assert codec.to_datum(decoded) == (version.kind, _from_json(case["current"]))


def test_released_schema_versions_are_frozen() -> None:
    """A released `vN.avsc` never changes: its canonical-form fingerprint is pinned."""
    pinned = json.loads((codec.SCHEMAS_DIR / "fingerprints.json").read_text())
    actual = {
        f"{v.kind}/v{v.version}": fastavro.schema.fingerprint(
            fastavro.schema.to_parsing_canonical_form(v.parsed), "CRC-64-AVRO"
        )
        for v in _versions()
    }
    assert actual == pinned


def _from_json(value: Any) -> Any:
    """JSON examples spell bytes as {"$bytes": "<latin-1>"} and unions of records as
    {"$record": "<full name>", "value": {...}}."""
    if isinstance(value, dict):
        if set(value) == {"$bytes"}:
            return value["$bytes"].encode("latin-1")
        if set(value) == {"$record", "value"}:
            return (value["$record"], _from_json(value["value"]))
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


@pytest.mark.parametrize(
    "record",
    [
        StagedBatch(
            BatchId(0, 1), Frontier.at(1), Frontier.at(2), (0, 1), (Part("k", 0, 2, 1, 10, 2),), "w"
        ),
        BatchDescription("s", BatchId(0, 1), Frontier.at(1), Frontier.at(2), 0),
        Updates((Update(b"\x02a", None, 3, 1), Update(None, "bad", 3, -1))),
    ],
)
def test_a_forged_length_allocates_nothing_before_the_record_ends(record: Any) -> None:
    """Avro-framed records carry no compression: a length or block count forged to 2^62 at any
    position ends in `DecodeError` once the bytes run out, without allocating for it, so what
    such a record decodes to is bounded by its own size (the broker's `message.max.bytes`);
    only `UpdatesArrow`, which is compressed, needs `max_record_bytes`."""
    import tracemalloc

    data, huge = codec.encode(record), bytes([0xFE, *[0xFF] * 8, 0x7F])
    for position in range(codec.HEADER_LEN, len(data)):
        tracemalloc.start()
        try:
            codec.decode(data[:position] + huge + data[position + 1 :])
        except DecodeError:
            pass
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert peak < 1 << 20, (position, peak)
