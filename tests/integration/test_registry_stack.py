"""The embedded stack's Schema Registry (`mvsink.stack.registry`: Apicurio's Confluent-compatible
API): what the Confluent client does against it (register, look up, compatibility levels and
checks, refusals), and how the stack runs it (loopback only, recorded, reused, stopped,
exported).

The first use fetches Apicurio's distribution from Maven Central into the shared cache (about
150 MB, seconds on a fast link); every later one starts the server in about 5 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from mvsink.io.config import cache_dir
from mvsink.stack import procs
from mvsink.stack.manager import REGISTRY, Stack
from mvsink.stack.registry import RegistryNode
from mvsink.stack.state import ComponentRecord, load_records, running_endpoints, save_records

pytestmark = pytest.mark.integration


def record(name: str, *fields: dict[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": list(fields)}


def avro(name: str, *fields: dict[str, Any]) -> Schema:
    return Schema(json.dumps(record(name, *fields)), "AVRO")


V1 = ({"name": "id", "type": "long"},)
#: BACKWARD compatible with V1: the new field has a default.
V2 = (*V1, {"name": "note", "type": ["null", "string"], "default": None})
#: Compatible with nothing before it: `id` changes type.
BREAKING = ({"name": "id", "type": "string"},)


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture
def client(schema_registry_url: str) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": schema_registry_url})


def test_registering_answers_one_id_per_distinct_schema_as_confluent_does(
    client: SchemaRegistryClient, unique: str
) -> None:
    first = client.register_schema(f"{unique}-a-value", avro(f"R{unique}", *V1))
    assert client.register_schema(f"{unique}-a-value", avro(f"R{unique}", *V1)) == first
    # the same schema in another subject: the same id (a content id, not one per version)
    assert client.register_schema(f"{unique}-b-value", avro(f"R{unique}", *V1)) == first
    assert client.get_versions(f"{unique}-a-value") == [1]
    second = client.register_schema(f"{unique}-a-value", avro(f"R{unique}", *V2))
    assert second != first
    assert json.loads(str(client.get_schema(second).schema_str)) == record(f"R{unique}", *V2)
    latest = client.get_latest_version(f"{unique}-a-value")
    assert (latest.schema_id, latest.version) == (second, 2)
    found = client.lookup_schema(f"{unique}-a-value", avro(f"R{unique}", *V1))
    assert (found.schema_id, found.version) == (first, 1)
    assert {f"{unique}-a-value", f"{unique}-b-value"} <= set(client.get_subjects())


def test_the_confluent_serializers_round_trip_through_it(
    client: SchemaRegistryClient, unique: str
) -> None:
    schema = json.dumps(record(f"R{unique}", *V2))
    context = SerializationContext(f"{unique}-topic", MessageField.VALUE)
    framed = AvroSerializer(client, schema)({"id": 7, "note": "x"}, context)
    assert framed is not None and framed[0] == 0
    assert (
        int.from_bytes(framed[1:5], "big")
        == client.get_latest_version(f"{unique}-topic-value").schema_id
    )
    assert AvroDeserializer(client)(framed, context) == {"id": 7, "note": "x"}


def test_compatibility_levels_checks_and_refusals(
    client: SchemaRegistryClient, schema_registry_url: str, unique: str
) -> None:
    # the global level is NONE, so each subject's own level decides (`mvsink.stack.registry`)
    assert get(f"{schema_registry_url}/config")["compatibilityLevel"] == "NONE"
    name = f"{unique}-value"
    # a subject's level can be set before the subject exists, as mvsink's provisioning does
    client.set_compatibility(name, "BACKWARD_TRANSITIVE")
    assert client.get_compatibility(name) == "BACKWARD_TRANSITIVE"
    client.register_schema(name, avro(f"R{unique}", *V1))
    assert client.test_compatibility(name, avro(f"R{unique}", *V2))
    assert not client.test_compatibility(name, avro(f"R{unique}", *BREAKING))
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(name, avro(f"R{unique}", *BREAKING))
    assert refused.value.http_status_code == 409
    assert refused.value.error_code == 409
    assert client.get_versions(name) == [1]
    client.set_compatibility(name, "NONE")
    assert client.get_compatibility(name) == "NONE"
    client.register_schema(name, avro(f"R{unique}", *BREAKING))
    assert client.get_versions(name) == [1, 2]


def test_unknown_ids_and_subjects_are_404s_with_confluent_error_codes(
    client: SchemaRegistryClient, unique: str
) -> None:
    with pytest.raises(SchemaRegistryError) as no_id:
        client.get_schema(2_000_000_000)
    assert (no_id.value.http_status_code, no_id.value.error_code) == (404, 40403)
    with pytest.raises(SchemaRegistryError) as no_subject:
        client.get_versions(f"{unique}-nothing-value")
    assert (no_subject.value.http_status_code, no_subject.value.error_code) == (404, 40401)


@pytest.fixture
def lone_stack(tmp_path: Path) -> Iterator[Stack]:
    """A stack home of this test's own, stopped afterwards."""
    stack = Stack(tmp_path / "stack", cache_dir())
    try:
        yield stack
    finally:
        stack.down()


def listening_ports(pid: int) -> dict[int, str]:
    """The TCP ports `pid` listens on, with the address each is bound to (`ss`)."""
    out = subprocess.run(
        ["ss", "-Hltnp"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    found = {}
    for line in out.splitlines():
        if f"pid={pid}," in line:
            host, _, port = line.split()[3].rpartition(":")
            found[int(port)] = host
    return found


def test_the_stack_runs_it_on_loopback_records_reuses_and_stops_it(lone_stack: Stack) -> None:
    url = lone_stack.registry_up(timeout=180)
    record = load_records(lone_stack.home)[REGISTRY]
    assert url == f"http://{record.address}/apis/ccompat/v7" == lone_stack.registry_url()
    assert record.address.startswith(f"{procs.LOOPBACK}:")
    assert set(record.ports) == set(RegistryNode.PORTS)
    # its one listener, the API, on 127.0.0.1 only
    bound = listening_ports(record.pid)
    assert set(record.ports.values()) == set(bound)
    assert all(host in ("127.0.0.1", "[::ffff:127.0.0.1]") for host in bound.values()), bound
    rows = {row.name: row for row in lone_stack.status()}
    assert rows[REGISTRY].state == "running" and rows[REGISTRY].pid == record.pid
    assert get(f"{url}/subjects") == []

    assert lone_stack.registry_up() == url  # running: left alone
    assert load_records(lone_stack.home)[REGISTRY].pid == record.pid

    assert lone_stack.down() == [REGISTRY]
    assert not record.alive and lone_stack.registry_url() == ""
    assert {row.name: row.state for row in lone_stack.status()}[REGISTRY] == "stopped"
    # a restart gets the recorded (free again) ports back, with empty storage
    assert lone_stack.registry_up(timeout=180) == url
    assert get(f"{url}/subjects") == []


def test_running_endpoints_name_the_registry_only_while_it_runs(tmp_path: Path) -> None:
    home = tmp_path / "stack"  # `stack_home(tmp_path)`
    gone = subprocess.Popen(["true"])
    gone.wait()
    alive = os.getpid()
    records = {
        name: ComponentRecord(name, alive, f"127.0.0.1:{port}", {"port": port}, "-")
        for name, port in (("kafka", 1), ("minio", 2), (REGISTRY, 3))
    }
    save_records(home, records)
    assert running_endpoints(tmp_path)["schema_registry_url"] == (
        "http://127.0.0.1:3/apis/ccompat/v7"
    )
    records[REGISTRY].pid = gone.pid
    save_records(home, records)
    assert "schema_registry_url" not in running_endpoints(tmp_path)
    assert running_endpoints(tmp_path)["kafka_bootstrap"] == "127.0.0.1:1"
