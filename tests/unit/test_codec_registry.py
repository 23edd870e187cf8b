"""The Schema Registry wire format of `mvsink.core.codec` and the subjects of `mvsink.io.registry`
(pure: the registry's id lookup is a function here; tests/integration/test_schema_registry.py
runs the real registry)."""

from __future__ import annotations

import io
import json

import fastavro
import pytest

from mvsink.core import codec
from mvsink.core.errors import DecodeError
from mvsink.core.frontier import Frontier
from mvsink.core.messages import (
    BatchDescription,
    BatchId,
    Progress,
    Record,
    ShardUpper,
    SinkControl,
    Update,
    Updates,
)
from mvsink.io.config import Topics
from mvsink.io.registry import subject, topic_kinds

RECORDS = [
    ShardUpper("s", Frontier.at(7), 3),
    BatchDescription("s", BatchId(1, 2), Frontier.at(0), Frontier.at(5), 1),
    Progress(Frontier.at(9)),
    Updates((Update(row=b"\x02", err=None, time=3, diff=1),)),
    SinkControl(read_only=True),
]


class Message:
    """The parts of a Kafka message the codec reads."""

    def __init__(self, value: bytes, headers: list[tuple[str, bytes]] | None = None) -> None:
        self._value, self._headers = value, headers

    def value(self) -> bytes:
        return self._value

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 41


def _lookup_of(ids: dict[int, codec.SchemaVersion]) -> codec.SchemaLookup:
    def lookup(schema_id: int) -> codec.SchemaVersion:
        if schema_id not in ids:
            raise DecodeError(f"schema id {schema_id} unknown")
        return ids[schema_id]

    return lookup


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_a_registry_framed_record_is_magic_zero_its_id_and_the_avro_body(record: Record) -> None:
    data = codec.encode_registered(record, 0x01020304)
    assert data[:5] == b"\x00\x01\x02\x03\x04"
    assert codec.registered_id(data) == 0x01020304
    # the body is plain Avro under the latest schema: what any Confluent deserializer reads
    kind, _ = codec.to_datum(record)
    body = fastavro.schemaless_reader(
        io.BytesIO(data[5:]), codec.latest(kind).parsed, return_record_name=True
    )
    assert codec.from_datum(kind, body) == record
    assert data[5:] == codec.encode(record)[codec.HEADER_LEN :]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_a_registry_framed_record_decodes_by_its_id(record: Record) -> None:
    kind, _ = codec.to_datum(record)
    data = codec.encode_registered(record, 17)
    assert codec.decode(data, lookup=_lookup_of({17: codec.latest(kind)})) == record
    with pytest.raises(DecodeError, match="schema id 18 unknown"):
        codec.decode(codec.encode_registered(record, 18), lookup=_lookup_of({}))


def test_with_no_registry_the_schema_header_names_the_writer_schema() -> None:
    record = ShardUpper("s", Frontier.at(7), 3)
    data = codec.encode_registered(record, 5)
    header = codec.schema_header(record).encode()
    message = Message(data, [("other", b"x"), (codec.SCHEMA_HEADER, header)])
    assert codec.decode_message(message) == record
    with pytest.raises(DecodeError, match="set schema_registry_url") as error:
        codec.decode_message(Message(data))
    assert "topic=t partition=0 offset=41" in str(error.value)
    with pytest.raises(DecodeError, match="names no mvsink schema"):
        codec.decode_message(Message(data, [(codec.SCHEMA_HEADER, b"Nope/v1")]))


def test_the_lookup_not_the_header_decides_when_a_registry_is_at_hand() -> None:
    record = ShardUpper("s", Frontier.at(7), 3)
    data = codec.encode_registered(record, 5)
    lying = Message(data, [(codec.SCHEMA_HEADER, b"SinkControl/v1")])
    lookup = _lookup_of({5: codec.latest("ShardUpper")})
    assert codec.decode_message(lying, lookup=lookup) == record


def test_an_old_writer_version_resolves_to_the_latest_reader() -> None:
    v1 = codec.schema_versions("DesiredRecord")[0]
    datum = ("mvsink.Progress", {"frontier": [4]})
    own = codec.encode_datum("DesiredRecord", datum, v1)
    registered = b"\x00\x00\x00\x00\x09" + own[codec.HEADER_LEN :]
    assert codec.decode(registered, lookup=_lookup_of({9: v1})) == Progress(Frontier.at(4))


def test_both_framings_are_read_and_anything_else_is_refused() -> None:
    record = SinkControl(read_only=False)
    assert codec.decode(codec.encode(record)) == record
    with pytest.raises(DecodeError, match="not an mvsink record"):
        codec.decode(b"\x01\x00\x00\x00\x01\x00")
    with pytest.raises(DecodeError, match="trailing bytes"):
        codec.decode(
            codec.encode_registered(record, 1) + b"\x00",
            lookup=_lookup_of({1: codec.latest("SinkControl")}),
        )


def test_a_registered_schema_matches_its_release_whatever_its_formatting() -> None:
    for kind in codec.KINDS.values():
        for version in codec.schema_versions(kind):
            text = codec.schema_text(version)
            assert codec.match_schema(text) is version
            # a registry may answer the schema compacted, its docs dropped
            compact = json.dumps(json.loads(text), separators=(",", ":"))
            assert codec.match_schema(compact) is version
    foreign = {"type": "record", "name": "Other", "fields": [{"name": "a", "type": "int"}]}
    with pytest.raises(DecodeError, match="none of mvsink's"):
        codec.match_schema(json.dumps(foreign))
    with pytest.raises(DecodeError, match="not Avro"):
        codec.match_schema('{"type": "nonsense"}')


def test_subjects_follow_the_topic_name_and_record_name_strategies() -> None:
    kinds = topic_kinds(Topics.for_sink("orders"))
    subjects = {subject(topic, kind) for topic, ks in kinds.items() for kind in ks}
    assert subjects == {
        "orders.desired-value",
        "orders.descs-value",
        "orders.batches-value",
        "mvsink.SinkControl",
        "mvsink.SinkRepair",
        "mvsink.DesiredProgress",
        "mvsink.ShardUpper",
        "sinks-value",
    }
    # every kind has a topic, and a topic with several kinds names each by its record
    assert sorted(k for ks in kinds.values() for k in ks) == sorted(codec.KINDS.values())
    assert all(
        len(ks) == 1 or all(subject(t, k).startswith("mvsink.") for k in ks)
        for t, ks in kinds.items()
    )
