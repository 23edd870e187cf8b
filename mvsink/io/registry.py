"""The Confluent Schema Registry framing of mvsink's records (`[kafka] schema_registry_url`).

With a registry configured, every record this process writes is framed as the registry's wire
format (`mvsink.core.codec`: magic 0, the schema id, the Avro body) instead of mvsink's own, so
Kafka Connect, ksqlDB, Flink's Avro formats and the Confluent deserializers read mvsink's topics
with nothing but the registry. Readers accept both framings at all times.

Subjects follow the usual strategies:

- a topic that carries one record kind (`<sink>.desired`, `<sink>.descs`, `<sink>.batches`) has
  the topic-name subject `<topic>-value`;
- the kinds that share a topic (`DesiredProgress` and `ShardUpper` on `frontiers`,
  `SinkControl` and `SinkRepair` on `<sink>.control`) use the record-name subject, the schema's
  full name (`mvsink.ShardUpper`).

Provisioning (`provision_schemas`) sets each subject's compatibility level and registers every
released version of its kind oldest first, checking each against what the subject holds, so a
schema change that breaks the level is refused before anything is written with it. The level is
`BACKWARD_TRANSITIVE`: mvsink's readers decode with the latest version whatever older one wrote a
record (schemas/README.md), which is exactly that level's promise.

What a process writes with and reads with is a `Framing`, made once from its configuration
(`framing`) and handed to its producers and readers (a Spark task worker keeps one per registry
url its drivers ship). A schema id, once looked up, is cached for the framing's life: a registry
never changes what an id stands for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from mvsink.core import codec
from mvsink.core.errors import DecodeError, MvsinkError
from mvsink.core.messages import Record

log = logging.getLogger("mvsink.io.registry")
T = TypeVar("T")

#: The compatibility level provisioning sets on every subject (see the module docs).
COMPATIBILITY = "BACKWARD_TRANSITIVE"
#: Record kinds that share a topic with another kind, so their subject is the record's name.
SHARED_TOPIC_KINDS = frozenset({"DesiredProgress", "ShardUpper", "SinkControl", "SinkRepair"})
#: How long a lookup or registration retries an unreachable registry before it gives up.
RETRY_FOR = 30.0


class RegistryError(MvsinkError):
    """The registry refused or could not be reached: a condition of the deployment, never of a
    record (a reader retries instead of quarantining the record it was decoding)."""


class IncompatibleSchema(RegistryError):
    """A released schema breaks its subject's compatibility level (found at provisioning)."""


def subject(topic: str, kind: str) -> str:
    """The subject that `kind`'s schemas have when written to `topic` (see the module docs)."""
    if kind in SHARED_TOPIC_KINDS:
        return f"mvsink.{kind}"
    return f"{topic}-value"


class SinkTopics(Protocol):
    """The topic names of a sink (`mvsink.io.config.Topics`, which imports this module)."""

    @property
    def desired(self) -> str: ...
    @property
    def descs(self) -> str: ...
    @property
    def batches(self) -> str: ...
    @property
    def control(self) -> str: ...
    @property
    def frontiers(self) -> str: ...
    @property
    def sinks(self) -> str: ...


def topic_kinds(topics: SinkTopics) -> dict[str, tuple[str, ...]]:
    """The record kinds each of a sink's topics carries."""
    return {
        topics.desired: ("DesiredRecord",),
        topics.descs: ("BatchDescription",),
        topics.batches: ("StagedBatch",),
        topics.control: ("SinkControl", "SinkRepair"),
        topics.frontiers: ("DesiredProgress", "ShardUpper"),
        topics.sinks: ("SinkDefinition",),
    }


def _schema(version: codec.SchemaVersion) -> Schema:
    return Schema(codec.schema_text(version), "AVRO")


class Registry:
    """One Schema Registry (its Confluent-compatible API at `url`) and this process's caches of
    its ids: writer ids by subject and kind, schema versions by id."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._client = SchemaRegistryClient({"url": url})
        self._ids: dict[tuple[str, str], int] = {}
        self._versions: dict[int, codec.SchemaVersion] = {}
        self._lock = threading.Lock()

    def _call(self, what: str, call: Callable[..., T], *args: Any) -> T:
        """`call(*args)`, retrying an unreachable registry for `RETRY_FOR` seconds; a refusal
        (an HTTP error the registry answers) is raised at once as a `SchemaRegistryError`."""
        deadline = time.monotonic() + RETRY_FOR
        while True:
            try:
                return call(*args)
            except SchemaRegistryError:
                raise
            except Exception as error:  # the client raises the transport's errors as they are
                if time.monotonic() >= deadline:
                    raise RegistryError(
                        f"{what}: registry {self.url} unreachable: {error!r}"
                    ) from error
                log.warning("%s: registry %s unreachable (%r), retrying", what, self.url, error)
                time.sleep(1.0)

    def schema_id(self, topic: str, kind: str) -> int:
        """The id of `kind`'s latest schema under its subject for `topic`, registering it there
        if the subject lacks it (a registry answers an already registered schema's id)."""
        key = (subject(topic, kind), kind)
        with self._lock:
            found = self._ids.get(key)
        if found is not None:
            return found
        try:
            schema_id = self._call(
                f"registering {key[0]}",
                self._client.register_schema,
                key[0],
                _schema(codec.latest(kind)),
            )
        except SchemaRegistryError as error:
            raise RegistryError(f"registering {kind} under {key[0]}: {error}") from error
        with self._lock:
            self._ids[key] = schema_id
            self._versions.setdefault(schema_id, codec.latest(kind))
        return schema_id

    def encode(self, topic: str, record: Record) -> bytes:
        """`record` in the registry's wire format, for `topic`."""
        kind, _ = codec.to_datum(record)
        return codec.encode_registered(record, self.schema_id(topic, kind))

    def lookup(self, schema_id: int) -> codec.SchemaVersion:
        """The released schema version that `schema_id` stands for.

        Raises:
            DecodeError: the registry has no such id, or its schema is none of mvsink's.
            RegistryError: the registry could not be reached.
        """
        with self._lock:
            found = self._versions.get(schema_id)
        if found is not None:
            return found
        try:
            schema = self._call(
                f"looking up schema id {schema_id}", self._client.get_schema, schema_id
            )
        except SchemaRegistryError as error:
            if error.http_status_code == 404:
                raise DecodeError(f"schema id {schema_id} is not in registry {self.url}") from error
            raise RegistryError(f"looking up schema id {schema_id}: {error}") from error
        version = codec.match_schema(str(schema.schema_str))
        with self._lock:
            self._versions[schema_id] = version
        return version

    def subjects(self) -> list[str]:
        """Every subject the registry holds."""
        return list(self._call("listing subjects", self._client.get_subjects))

    def compatibility(self, name: str) -> str:
        """The compatibility level subject `name` has."""
        return str(
            self._call(f"reading {name}'s compatibility", self._client.get_compatibility, name)
        )

    def provision(
        self, topics: Mapping[str, Sequence[str]], level: str = COMPATIBILITY
    ) -> list[str]:
        """Give every subject of `topics` (topic -> kinds, `topic_kinds`) the compatibility
        `level` and every released version of its kind, oldest first; the subjects registered.

        Raises:
            IncompatibleSchema: a version breaks what its subject holds under `level`; nothing
                after it is registered.
        """
        done: list[str] = []
        for topic, kinds in topics.items():
            for kind in kinds:
                name = subject(topic, kind)
                if name in done:
                    continue
                self._provision_subject(name, codec.schema_versions(kind), level)
                done.append(name)
        return done

    def _provision_subject(
        self, name: str, versions: Iterable[codec.SchemaVersion], level: str
    ) -> None:
        """Set `name`'s level, then register each of `versions` the subject lacks, checked
        first against what it holds (the versions it already has were checked when they were
        registered: an old one need not read what a newer one writes)."""
        try:
            self._call(
                f"setting {name}'s compatibility", self._client.set_compatibility, name, level
            )
            holds = bool(self._versions_of(name))
            for version in versions:
                schema_id = self._registered_id(name, version)
                if schema_id is None:
                    schema_id = self._register_checked(name, version, level, holds)
                holds = True
                with self._lock:
                    self._versions.setdefault(schema_id, version)
        except SchemaRegistryError as error:
            raise RegistryError(f"provisioning subject {name}: {error}") from error

    def _register_checked(
        self, name: str, version: codec.SchemaVersion, level: str, holds: bool
    ) -> int:
        schema = _schema(version)
        refused = (
            f"{version.kind}/v{version.version} ({version.path}) is not {level} compatible with "
            f"the schemas registered under {name} in {self.url}: add a version whose new fields "
            "have defaults instead (schemas/README.md)"
        )
        if holds and not self._call(
            f"checking {name}", self._client.test_compatibility, name, schema
        ):
            raise IncompatibleSchema(refused)
        try:
            return self._call(f"registering {name}", self._client.register_schema, name, schema)
        except SchemaRegistryError as error:  # the level is transitive: the check saw latest
            if error.http_status_code != 409:
                raise
            raise IncompatibleSchema(f"{refused} ({error})") from error

    def _registered_id(self, name: str, version: codec.SchemaVersion) -> int | None:
        """The id of `version` under subject `name`, None if the subject lacks it."""
        try:
            found = self._call(
                f"looking {name} up", self._client.lookup_schema, name, _schema(version)
            )
        except SchemaRegistryError as error:
            if error.http_status_code == 404:
                return None
            raise
        return int(found.schema_id) if found.schema_id is not None else None

    def _versions_of(self, name: str) -> list[int]:
        try:
            return list(self._call(f"listing {name}", self._client.get_versions, name))
        except SchemaRegistryError as error:
            if error.http_status_code == 404:
                return []
            raise


@dataclass(frozen=True)
class Framing:
    """How one process frames the records it writes and finds a registry-framed record's
    schema: through `registry` (its wire format; ids looked up there), or mvsink's own framing
    (`OWN`; a registry-framed record's schema then comes from its `SCHEMA_HEADER`). Readers
    accept both framings either way. Made once from the configuration (`framing`) by whatever
    owns the process's producers and readers, and passed to them."""

    registry: Registry | None = None

    def encode(self, topic: str, record: Record) -> bytes:
        """`record` framed for `topic`: the registry's wire format, else mvsink's own."""
        if self.registry is None:
            return codec.encode(record)
        return self.registry.encode(topic, record)

    @property
    def lookup(self) -> codec.SchemaLookup | None:
        """How a registry-framed record's schema id is looked up (None: by its header)."""
        return None if self.registry is None else self.registry.lookup


#: mvsink's own framing: no registry.
OWN = Framing()


def framing(url: str) -> Framing:
    """The framing of a process configured with the registry at `url` (empty: `OWN`). Each
    call makes a new client with empty caches: call it once per process or task worker."""
    return Framing(Registry(url)) if url else OWN


class Framings:
    """The framings of the registry urls a long-lived worker meets (a Spark task worker, whose
    specs name their sink's registry), each made on first use and kept with its id caches."""

    def __init__(self) -> None:
        self._by_url: dict[str, Framing] = {}
        self._lock = threading.Lock()

    def of(self, url: str) -> Framing:
        """The framing of the registry at `url` (empty: mvsink's own)."""
        with self._lock:
            found = self._by_url.get(url)
            if found is None:
                found = self._by_url[url] = framing(url)
            return found
