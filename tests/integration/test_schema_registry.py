"""mvsink on a real Schema Registry (Apicurio's Confluent-compatible API, `schema_registry_url`):
provisioning registers and guards the subjects, the whole pipeline runs on the registry's wire
format, and tools that know nothing of mvsink read its topics: kcat fetches the raw values, and
each is decoded from the schema the registry gives for its id, by fastavro and by the Confluent
client's own Avro deserializer."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from sinkkit import BENCH, Sink, cli_env, mvsink_cli

from mvsink.core import codec
from mvsink.io.config import S3Settings
from mvsink.io.registry import COMPATIBILITY, IncompatibleSchema, subject
from mvsink.tools.provision import provision

pytestmark = pytest.mark.integration


def kcat_values(bootstrap: str, topic: str) -> list[tuple[str, bytes]]:
    """Every committed `(key, value)` of `topic`, as kcat prints them (`%K:%k%S:%s`: lengths
    before the bytes, so binary values parse exactly)."""
    kcat = shutil.which("kcat")
    assert kcat, "kcat is not installed (Debian: apt-get install kcat)"
    out = subprocess.run(
        [
            *(kcat, "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-q"),
            *("-X", "isolation.level=read_committed", "-f", "%K:%k%S:%s"),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    ).stdout
    found: list[tuple[str, bytes]] = []
    at = 0
    while at < len(out):
        colon = out.index(b":", at)
        key_len = int(out[at:colon])
        key = out[colon + 1 : colon + 1 + max(key_len, 0)]
        at = colon + 1 + max(key_len, 0)
        colon = out.index(b":", at)
        size = int(out[at:colon])
        found.append((key.decode(), out[colon + 1 : colon + 1 + size]))
        at = colon + 1 + size
    return found


def registered_schema(url: str, schema_id: int) -> Any:
    """The schema the registry holds under `schema_id`, fetched by plain HTTP (Confluent API)."""
    with urllib.request.urlopen(f"{url}/schemas/ids/{schema_id}", timeout=30) as response:
        return json.loads(json.loads(response.read())["schema"])


def test_the_demo_runs_on_the_registry_wire_format_and_generic_tools_read_every_topic(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path, schema_registry_url: str
) -> None:
    env = cli_env(kafka_bootstrap, s3_settings, tmp_path)
    env["MVSINK_SCHEMA_REGISTRY_URL"] = schema_registry_url
    demo = subprocess.run(
        [sys.executable, "-m", "mvsink.cli", "demo", "--no-stack", "--ticks", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "demo OK" in demo.stderr
    found = re.search(r"sink (demo-\S+):", demo.stderr)
    assert found, demo.stderr[-3000:]
    run = found.group(1)

    client = SchemaRegistryClient({"url": schema_registry_url})
    deserializer = AvroDeserializer(client)
    topics = {
        f"{run}.desired": ("DesiredRecord", ""),
        f"{run}.descs": ("BatchDescription", ""),
        f"{run}.batches": ("StagedBatch", ""),
        "frontiers": ("", f":{run}"),  # shared by every sink: only this run's keys
    }
    seen: dict[str, set[str]] = {}
    for topic, (kind, key_part) in topics.items():
        values = [(k, v) for k, v in kcat_values(kafka_bootstrap, topic) if key_part in k]
        assert values, f"kcat read nothing of this run from {topic}"
        for key, value in values:
            assert value[0] == 0, f"{topic} {key}: not the registry wire format: {value[:5]!r}"
            schema_id = int.from_bytes(value[1:5], "big")
            text = registered_schema(schema_registry_url, schema_id)
            datum: Any = fastavro.schemaless_reader(
                io.BytesIO(value[5:]), fastavro.parse_schema(text)
            )
            confluent = deserializer(value, SerializationContext(topic, MessageField.VALUE))
            assert confluent == datum
            name = codec.match_schema(json.dumps(text)).kind
            assert not kind or name == kind
            seen.setdefault(topic, set()).add(name)
            if name in ("BatchDescription", "DesiredProgress"):
                assert datum["sink_id"] == run
            if name == "ShardUpper":
                assert datum["shard_id"] == run
    assert seen["frontiers"] == {"DesiredProgress", "ShardUpper"}
    subjects = set(client.get_subjects())
    assert {f"{run}.desired-value", f"{run}.descs-value", f"{run}.batches-value"} <= subjects
    assert {"mvsink.DesiredProgress", "mvsink.ShardUpper"} <= subjects


def test_provisioning_registers_every_subject_and_refuses_a_breaking_schema_change(
    kafka_bootstrap: str,
    s3_settings: S3Settings,
    tmp_path: Path,
    schema_registry_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sink = Sink.create(kafka_bootstrap, s3_settings, tmp_path)
    config = replace(sink.config, schema_registry_url=schema_registry_url)
    result = provision(config)
    topics = config.topics
    client = SchemaRegistryClient({"url": schema_registry_url})
    descs = subject(topics.descs, "BatchDescription")
    desired = subject(topics.desired, "DesiredRecord")
    assert {descs, desired, "mvsink.ShardUpper"} <= set(result.subjects)
    assert client.get_compatibility(descs) == COMPATIBILITY
    # every released version, oldest first: a reader of any of them finds its id
    assert len(client.get_versions(desired)) == len(codec.schema_versions("DesiredRecord"))
    assert provision(config).subjects == result.subjects  # idempotent
    assert len(client.get_versions(desired)) == len(codec.schema_versions("DesiredRecord"))

    # a release that breaks BACKWARD_TRANSITIVE: a new field a reader cannot default
    schemas = tmp_path / "schemas"
    shutil.copytree(codec.SCHEMAS_DIR, schemas)  # type: ignore[arg-type]
    v1 = json.loads((schemas / "BatchDescription" / "v1.avsc").read_text())
    v1["fields"].append({"name": "priority", "type": "int"})
    (schemas / "BatchDescription" / "v2.avsc").write_text(json.dumps(v1))
    monkeypatch.setattr(codec, "SCHEMAS_DIR", schemas)
    codec.schema_versions.cache_clear()
    codec._canonical_versions.cache_clear()
    try:
        with pytest.raises(IncompatibleSchema, match=r"BatchDescription/v2 .* BACKWARD_TRANSITIVE"):
            provision(config)
    finally:
        monkeypatch.undo()
        codec.schema_versions.cache_clear()
        codec._canonical_versions.cache_clear()
    assert len(client.get_versions(descs)) == 1  # nothing of the breaking release registered


@BENCH
def test_the_bench_measures_the_registry_framing_beside_mvsinks_own(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path, schema_registry_url: str
) -> None:
    """`mvsink bench --systems mvsink,mvsink-registry`: the same workload, once in mvsink's own
    framing and once in the registry's wire format (its desired topic encoded so, its services
    framing theirs), in one run; both shards equal the view and the ratio is reported."""
    env = cli_env(kafka_bootstrap, s3_settings, tmp_path)
    env["MVSINK_SCHEMA_REGISTRY_URL"] = schema_registry_url
    out = tmp_path / "out"
    done = mvsink_cli(
        [
            *("bench", "--no-stack", "--keys", "3000", "--ticks", "3"),
            *("--repeats", "1", "--seconds", "0"),
            # no broker warm-up (a whole mvsink column more): `test_bench.py` checks it
            *("--warm-up", "0"),
            *("--systems", "mvsink,mvsink-registry", "--out", str(out)),
        ],
        env,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    figures = json.loads((out / "bench.json").read_text())
    assert figures["systems"] == ["mvsink", "mvsink-registry"]
    assert figures["mvsink_shard_equals_desired"] is True
    assert figures["mvsink-registry_shard_equals_desired"] is True
    for key in ("ratio_registry_vs_own_framing", "producer_registry_updates_per_cpu_s"):
        assert isinstance(figures[key], float) and figures[key] > 0, key
    assert "Schema Registry wire format: ratio mvsink (registry)/mvsink" in done.stderr
    # the registry column's desired topic is in the wire format; mvsink's own is not
    run = re.search(r"/bench/(cmp-[0-9a-f]{6})\b", done.stderr)  # "logs in <state>/bench/<run>"
    assert run, done.stderr[-3000:]
    client = SchemaRegistryClient({"url": schema_registry_url})
    assert f"{run.group(1)}-mvsink-registry.desired-value" in client.get_subjects()
    assert f"{run.group(1)}-mvsink.desired-value" not in client.get_subjects()
