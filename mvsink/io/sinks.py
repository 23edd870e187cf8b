"""Sinks as data: each sink's definition on the compacted `sinks` topic (docs/design.md §3.1).

A `SinkDefinition` holds what every replica of a sink must agree on — its shard, P, A, the
partitioning, `as_of`, `retain_history`, the `frontiers` topic and the row schema — keyed by the
sink id on one topic for the whole deployment (`[kafka] sinks_topic`). `provision` writes the
configured sink's (`define`), replacing what was there: provisioning is how a sink is created
and altered. A tombstone under the key is a dropped sink (`mvsink sink drop`, `drop`); the
topic keeps tombstones (`delete.retention.ms` of a century), so a drop is never forgotten by a
replica that starts later.

A service checks its settings against its sink's definition before it does anything
(`check_sink`): a setting that disagrees, or a dropped sink, stops it with exit 2 naming both
values. A sink with no definition (provisioned before definitions existed) is served as
configured, and the service says so once.
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
        **{name: getattr(definition, name) for name in SHARED if name != "frontiers_topic"},
    )


def define(config: Config) -> SinkDefinition:
    """Write `config`'s sink's definition (creating the sinks topic if missing); it replaces
    the sink's earlier definition or drop."""
    ensure_topics(config.kafka_bootstrap, [sinks_topic(config.topics)])
    definition = definition_of(config)
    _publish(config, definition.sink_id, definition)
    log.info("defined sink %s on %s", definition.sink_id, config.topics.sinks)
    return definition


def drop(config: Config, sink_id: str) -> None:
    """Write `sink_id`'s tombstone: the sink is dropped; its replicas refuse to start."""
    ensure_topics(config.kafka_bootstrap, [sinks_topic(config.topics)])
    _publish(config, sink_id, None)
    log.info("dropped sink %s on %s", sink_id, config.topics.sinks)


def _publish(config: Config, sink_id: str, definition: SinkDefinition | None) -> None:
    producer = Producer(client_config(config.kafka_bootstrap, **{"enable.idempotence": True}))
    if definition is None:
        producer.produce(config.topics.sinks, key=sink_id.encode(), value=None)
    else:
        produce(producer, config.topics.sinks, sink_id, definition, framing=config.framing())
    if producer.flush(30) != 0:
        raise MvsinkError(f"writing sink {sink_id}'s definition to {config.topics.sinks} timed out")


def definitions(config: Config, timeout: float = 30.0) -> Mapping[str, SinkDefinition | None]:
    """Every sink's latest definition on the sinks topic, None for a dropped sink; empty when
    the topic does not exist yet. A record that does not decode, is no `SinkDefinition`, or
    names another sink than its key defines nothing: the key is left out with a warning, so its
    sink is served as configured, never stopped by it."""
    from confluent_kafka.admin import AdminClient

    existing = AdminClient(client_config(config.kafka_bootstrap)).list_topics(timeout=timeout)
    if config.topics.sinks not in existing.topics:
        return {}

    def bad(key: str, error: DecodeError) -> None:
        log.warning(
            "sinks topic: key %r has no definition: its latest value is bad: %s", key, error
        )

    latest = read_latest(
        config.kafka_bootstrap,
        config.topics.sinks,
        timeout,
        framing=config.framing(),
        tombstones=True,
        on_bad=bad,
    )
    found: dict[str, SinkDefinition | None] = {}
    for key, record in latest.items():
        if record is None or (isinstance(record, SinkDefinition) and record.sink_id == key):
            found[key] = record
        else:
            log.warning(
                "sinks topic: skipped key %r: %r is no definition of that sink", key, record
            )
    return found


def refusal(config: Config, definition: SinkDefinition | None) -> str | None:
    """Why a replica with `config` must not serve its sink defined as `definition` (None: the
    sink was dropped), or None."""
    if definition is None:
        return (
            f"sink {config.sink_id} was dropped (a tombstone on {config.topics.sinks}): a replica "
            f"of it does not start; `mvsink provision` defines it again"
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


def check_sink(config: Config, timeout: float = 30.0) -> None:
    """What a service checks before serving `config`'s sink: its topics' partition counts
    (`check_sink_topics`), then its sink's definition (`refusal`).

    Raises:
        TopicMismatch: a topic's partition count is not the replica's (exit 2).
        SinkRefused: a setting disagrees with the definition, or the sink was dropped (exit 2).
    """
    check_sink_topics(config, timeout)
    found = definitions(config, timeout)
    if config.sink_id not in found:
        log.warning(
            "sink %s has no definition on %s: served as configured (`mvsink provision` writes one)",
            config.sink_id,
            config.topics.sinks,
        )
        return
    refused = refusal(config, found[config.sink_id])
    if refused is not None:
        raise SinkRefused(refused)
