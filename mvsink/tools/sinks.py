"""Dropping a sink (`mvsink sink drop`): its definition written `dropped`, its checkpoints'
holds on its shard released, and with `purge` everything it owns deleted.

What a sink owns: its own topics (`<sink>.desired`, `.descs`, `.batches`, `.control`,
`.dead-letter`; never the shared `frontiers` and `sinks`), its keys on `frontiers` (tombstoned),
its write checkpoints (`sinks/<sink>/` in the bucket) and its shard (`shards/<shard>/`), unless
another sink's definition names that shard too.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from confluent_kafka import Producer

from mvsink.core.errors import MvsinkError
from mvsink.core.frontier import Frontier
from mvsink.core.messages import (
    DesiredProgress,
    SinkDefinition,
    desired_progress_key,
    shard_upper_key,
)
from mvsink.io.config import Config
from mvsink.io.kafka import client_config, delete_topics, read_latest, sink_topics
from mvsink.io.s3 import s3_client
from mvsink.io.sinks import definitions, drop, sink_of
from mvsink.shard.blob import MinioBlob

if TYPE_CHECKING:
    from mvsink.shard import Shard


@dataclass(frozen=True)
class Dropped:
    """What `drop_sink` did."""

    holds_released: tuple[str, ...]
    topics_deleted: tuple[str, ...] = ()
    objects_deleted: int = 0
    #: Why the shard was kept by a purge (another sink's definition names it), else "".
    shard_kept: str = ""


def own_topics(sink: Config) -> list[str]:
    """The topics only this sink uses (not the shared `frontiers` and `sinks`)."""
    return [spec.name for spec in sink_topics(sink) if spec.name != sink.topics.frontiers]


def purge_objects(sink: Config, prefixes: Iterable[str]) -> int:
    """Delete every object under `prefixes` in the sink's bucket; how many."""
    blob = MinioBlob(s3_client(sink.s3), sink.s3.bucket)
    keys = [listed.key for prefix in prefixes for listed in blob.list(prefix, recursive=True)]
    blob.remove(keys)
    return len(keys)


def drop_sink(config: Config, sink_id: str, purge: bool) -> Dropped:
    """Drop `sink_id`: its definition written `dropped` (its replicas refuse to start, running
    ones stop), then its checkpoints' holds on its shard released, then with `purge` what it
    owns deleted. A dropped sink can be purged later.

    Raises:
        MvsinkError: the sink has no definition, or was dropped already and `purge` is not set.
    """
    found = definitions(config)
    definition = found.get(sink_id)
    if definition is None:
        raise MvsinkError(f"sink {sink_id} has no definition on {config.topics.sinks}")
    if definition.dropped and not purge:
        raise MvsinkError(f"sink {sink_id} was dropped already (`--purge` deletes what it owns)")
    sink = sink_of(config, definition)
    if not definition.dropped:
        drop(sink)
    held = _release_holds(sink)
    if not purge:
        return Dropped(held)
    sharing = sorted(
        other.sink_id
        for other in found.values()
        if not other.dropped and other.sink_id != sink_id and other.shard_id == sink.shard_id
    )
    topics = tuple(delete_topics(sink.kafka_bootstrap, own_topics(sink)))
    _tombstone_frontiers(sink, shard=not sharing)
    prefixes = [f"sinks/{sink_id}/", *([] if sharing else [f"shards/{sink.shard_id}/"])]
    kept = f"sink(s) {', '.join(sharing)} use shard {sink.shard_id}" if sharing else ""
    return Dropped(held, topics, purge_objects(sink, prefixes), kept)


def sink_holds(shard: Shard, sink_id: str) -> tuple[str, ...]:
    """The holder ids of the critical holds `sink_id`'s checkpoints keep on `shard`."""
    prefix = f"checkpoint:{sink_id}:"
    return tuple(h.holder_id for h in shard.state().holds if h.holder_id.startswith(prefix))


def _release_holds(sink: Config) -> tuple[str, ...]:
    """Release the sink's checkpoints' holds on its shard; their holder ids (none when the
    shard was never made, or a purge deleted it)."""
    from mvsink.shard import ShardNotFound, open_shard

    try:
        shard = open_shard(sink.shard_id, None, sink.s3, sink.shard_timing())
    except ShardNotFound:
        return ()
    held = sink_holds(shard, sink.sink_id)
    if held:
        shard.release_holds(held)
    return held


def _tombstone_frontiers(sink: Config, shard: bool) -> None:
    """Tombstone the sink's progress keys on `frontiers`, and its shard's upper if `shard`
    (the shard is purged too)."""
    keys = [desired_progress_key(sink.sink_id, p) for p in range(sink.partitions)]
    keys += [shard_upper_key(sink.shard_id)] if shard else []
    producer = Producer(client_config(sink.kafka_bootstrap))
    for key in keys:
        producer.produce(sink.topics.frontiers, key=key.encode(), value=None)
    if producer.flush(30):
        raise MvsinkError(f"tombstoning sink {sink.sink_id}'s keys on {sink.topics.frontiers}")


@dataclass(frozen=True)
class SinkStanding:
    """Where a sink stands, for `mvsink sink list`: its desired frontier (the meet of its
    partitions' latest `DesiredProgress` on its `frontiers` topic; None before any) and the
    replicas owning its write partitions and append workers now (each member of its groups:
    its host and partitions)."""

    desired: Frontier | None
    writers: list[tuple[str, list[int]]]
    appenders: list[tuple[str, list[int]]]

    def lag(self, upper: Frontier) -> int | None:
        """Times the shard's `upper` trails desired (0 when caught up, None when unknown)."""
        if self.desired is None:
            return None
        if upper.time is None:  # the shard is closed: nothing left to write
            return 0
        if self.desired.time is None:  # desired is closed, the shard is not: no count of times
            return None
        return max(0, self.desired.time - upper.time)


def progress(
    config: Config, sinks: Iterable[SinkDefinition], timeout: float = 30.0
) -> dict[str, SinkStanding]:
    """Each of `sinks`' `SinkStanding`: one read of each `frontiers` topic they use, one
    description of their write and append groups."""
    from confluent_kafka.admin import AdminClient

    sinks = list(sinks)
    latest: dict[str, Any] = {}
    for topic in sorted({d.frontiers_topic for d in sinks}):
        try:
            latest.update(
                read_latest(
                    config.kafka_bootstrap, topic, timeout, framing=config.framing(),
                    tombstones=True, on_bad=lambda key, error: None,
                )
            )  # fmt: skip
        except MvsinkError:  # the topic does not exist yet
            continue
    groups = [f"{d.sink_id}.{role}" for d in sinks for role in ("write", "append")]
    owners: dict[str, list[tuple[str, list[int]]]] = {}
    if groups:
        admin = AdminClient(client_config(config.kafka_bootstrap))
        for group, future in admin.describe_consumer_groups(
            groups, request_timeout=timeout
        ).items():
            try:
                described = future.result(timeout)
            except Exception:
                continue
            owners[group] = sorted(
                (
                    m.host.lstrip("/"),
                    sorted(
                        tp.partition
                        for tp in (m.assignment.topic_partitions if m.assignment else [])
                    ),
                )
                for m in described.members
            )
    found = {}
    for d in sinks:
        records = [latest.get(desired_progress_key(d.sink_id, p)) for p in range(d.partitions)]
        frontiers = [r.frontier for r in records if isinstance(r, DesiredProgress)]
        desired = None
        if len(frontiers) == d.partitions:  # every partition has progressed
            desired = functools.reduce(Frontier.meet, frontiers)
        found[d.sink_id] = SinkStanding(
            desired, owners.get(f"{d.sink_id}.write", []), owners.get(f"{d.sink_id}.append", [])
        )
    return found
