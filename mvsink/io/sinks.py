"""Sinks as data: each sink's definition on the compacted `sinks` topic (docs/design.md §3.1).

A `SinkDefinition` holds what every replica of a sink must agree on — its shard, P, A, the
partitioning, `as_of`, `retain_history`, the `frontiers` topic and the row schema — keyed by the
sink id on one topic for the whole deployment (`[kafka] sinks_topic`). `provision` writes the
configured sink's (`define`), replacing what was there: provisioning is how a sink is created
and altered. `mvsink sink drop` writes the definition again with `dropped` (`drop`): a drop is
a value, not a tombstone, so compaction keeps it and a replica that starts a year later still
refuses, and a dropped sink's settings stay readable for its purge.

A service checks its settings against its sink's definition before it does anything
(`check_sink`): a setting that disagrees, or a dropped sink, stops it with exit 2 naming both
values; while it runs it reads the definition again every `[kafka] topic_check_interval` and
stops (exit 0) once its sink is dropped (`stop_when_dropped`). A sink with no definition
(provisioned before definitions existed) is served as configured, and the service says so
once.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import replace

from confluent_kafka import Producer

from mvsink.core.errors import DecodeError, MvsinkError
from mvsink.core.messages import SinkDefinition
from mvsink.io.config import Config, Topics
from mvsink.io.kafka import (
    check_sink_topics,
    client_config,
    ensure_topics,
    produce,
    read_latest,
    sinks_topic,
)
from mvsink.io.service import Stopping

log = logging.getLogger("mvsink.io.sinks")

#: The settings a replica must share with its sink's definition, as `Config` names them.
SHARED = (
    "shard_id",
    "partitions",
    "append_workers",
    "partitioning",
    "as_of",
    "retain_history",
    "frontiers_topic",
)


#: `Stopping.why` when a service stops because its sink was dropped (`stop_when_dropped`).
DROPPED = "the sink was dropped"


class SinkRefused(MvsinkError):
    """A replica's settings disagree with its sink's definition, or the sink was dropped
    (`check_sink`, exit 2)."""


def definition_of(config: Config) -> SinkDefinition:
    """The definition of `config`'s sink, as this process writes it now."""
    return SinkDefinition(
        sink_id=config.sink_id,
        frontiers_topic=config.topics.frontiers,
        row_schema=config.row_schema,
        defined_by=f"{socket.gethostname()}:{os.getpid()}",
        at_ms=int(time.time() * 1000),
        **{name: getattr(config, name) for name in SHARED if name != "frontiers_topic"},
    )


def sink_of(config: Config, definition: SinkDefinition) -> Config:
    """`config` for the sink `definition` describes (its ids, shared settings and topics)."""
    return replace(
        config,
        sink_id=definition.sink_id,
        topics=Topics.for_sink(definition.sink_id, definition.frontiers_topic, config.topics.sinks),
        row_schema=definition.row_schema or config.row_schema,
        **{name: getattr(definition, name) for name in SHARED if name != "frontiers_topic"},
    )


def define(config: Config) -> SinkDefinition:
    """Write `config`'s sink's definition (creating the sinks topic if missing); it replaces
    the sink's earlier definition or drop."""
    ensure_topics(config.kafka_bootstrap, [sinks_topic(config.topics)])
    definition = definition_of(config)
    _publish(config, definition)
    log.info("defined sink %s on %s", definition.sink_id, config.topics.sinks)
    return definition


def drop(config: Config) -> SinkDefinition:
    """Write `config`'s sink's definition `dropped`: its replicas refuse to start, running ones
    stop."""
    ensure_topics(config.kafka_bootstrap, [sinks_topic(config.topics)])
    dropped = replace(definition_of(config), dropped=True)
    _publish(config, dropped)
    log.info("dropped sink %s on %s", config.sink_id, config.topics.sinks)
    return dropped


def forget(config: Config) -> None:
    """Delete `config`'s sink's definition (a tombstone): for a sink nothing is left of, whose
    replicas need no refusal (the bench's own sinks, once discarded)."""
    producer = Producer(client_config(config.kafka_bootstrap))
    producer.produce(config.topics.sinks, key=config.sink_id.encode(), value=None)
    if producer.flush(30) != 0:
        raise MvsinkError(f"deleting sink {config.sink_id}'s definition timed out")


def _publish(config: Config, definition: SinkDefinition) -> None:
    producer = Producer(client_config(config.kafka_bootstrap, **{"enable.idempotence": True}))
    produce(producer, config.topics.sinks, definition.sink_id, definition, framing=config.framing())
    if producer.flush(30) != 0:
        raise MvsinkError(
            f"writing sink {definition.sink_id}'s definition to {config.topics.sinks} timed out"
        )


def definitions(
    config: Config, timeout: float = 30.0, bad: set[str] | None = None
) -> Mapping[str, SinkDefinition]:
    """Every sink's latest definition on the sinks topic (dropped ones too); empty when the
    topic does not exist yet. A tombstone (a key deleted by hand), a record that does not
    decode, is no `SinkDefinition`, or names another sink than its key defines nothing: the key
    is left out (and added to `bad` for a bad record), so its sink is served as configured,
    never stopped by it."""
    from confluent_kafka.admin import AdminClient

    existing = AdminClient(client_config(config.kafka_bootstrap)).list_topics(timeout=timeout)
    if config.topics.sinks not in existing.topics:
        return {}

    def on_bad(key: str, error: DecodeError) -> None:
        log.debug("sinks topic: key %r has no definition: its latest value is bad: %s", key, error)
        if bad is not None:
            bad.add(key)

    latest = read_latest(
        config.kafka_bootstrap,
        config.topics.sinks,
        timeout,
        framing=config.framing(),
        tombstones=True,
        on_bad=on_bad,
    )
    found: dict[str, SinkDefinition] = {}
    for key, record in latest.items():
        if isinstance(record, SinkDefinition) and record.sink_id == key:
            found[key] = record
        elif record is not None:
            log.debug("sinks topic: skipped key %r: %r is no definition of that sink", key, record)
            if bad is not None:
                bad.add(key)
    return found


def refusal(config: Config, definition: SinkDefinition) -> str | None:
    """Why a replica with `config` must not serve its sink defined as `definition`, or None."""
    if definition.dropped:
        return (
            f"sink {config.sink_id} was dropped (by {definition.defined_by} at "
            f"{definition.at_ms} ms, on {config.topics.sinks}): a replica of it does not start; "
            f"`mvsink provision` defines it again"
        )
    mine = definition_of(config)
    differ = [name for name in SHARED if getattr(mine, name) != getattr(definition, name)]
    if config.row_schema and definition.row_schema and not _same_rows(config, definition):
        differ.append("row_schema")
    if not differ:
        return None
    ours = ", ".join(f"{name} {getattr(mine, name)}" for name in differ)
    theirs = ", ".join(f"{name} {getattr(definition, name)}" for name in differ)
    return (
        f"sink {config.sink_id}: this replica's {ours} disagree with the sink's definition on "
        f"{config.topics.sinks} ({theirs}; written by {definition.defined_by} at "
        f"{definition.at_ms} ms): start it with the definition's settings, or change the sink "
        f"with `mvsink provision`"
    )


def _same_rows(config: Config, definition: SinkDefinition) -> bool:
    from mvsink.core.rows import parse_row_schema

    try:
        ours, theirs = parse_row_schema(config.row_schema), parse_row_schema(definition.row_schema)
        return bool(ours.equals(theirs))
    except MvsinkError:
        return False


def stop_when_dropped(config: Config, stopping: Stopping) -> None:
    """Read the sinks topic every `[kafka] topic_check_interval` while the service runs, and
    stop it (`Stopping.set`, exit 0) once its sink's definition is `dropped`: a dropped sink's
    work stops everywhere. A read that fails is no drop (the next one tries again), nor
    is a bad record (`definitions`)."""

    def check() -> None:
        try:
            found = definitions(config).get(config.sink_id)
        except Exception as error:  # an outage or a slow broker: not a drop
            log.debug("sinks topic not read: %r", error)
            return
        if found is not None and found.dropped:
            log.warning(
                "sink %s was dropped (by %s, on %s): stopping",
                config.sink_id,
                found.defined_by,
                config.topics.sinks,
            )
            stopping.set(DROPPED)

    stopping.every("sink-drop", config.topic_check_interval, check)


def check_sink(config: Config, timeout: float = 30.0) -> None:
    """What a service checks before serving `config`'s sink: its topics' partition counts
    (`check_sink_topics`), then its sink's definition (`refusal`).

    Raises:
        TopicMismatch: a topic's partition count is not the replica's (exit 2).
        SinkRefused: a setting disagrees with the definition, or the sink was dropped (exit 2).
    """
    check_sink_topics(config, timeout)
    bad: set[str] = set()
    found = definitions(config, timeout, bad)
    if config.sink_id not in found:
        log.warning(
            "sink %s has no definition on %s%s: served as configured (`mvsink provision` "
            "writes one)",
            config.sink_id,
            config.topics.sinks,
            " (its latest value there is no definition of it)" if config.sink_id in bad else "",
        )
        return
    refused = refusal(config, found[config.sink_id])
    if refused is not None:
        raise SinkRefused(refused)
