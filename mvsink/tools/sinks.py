"""Dropping a sink (`mvsink sink drop`): its definition written `dropped`, its checkpoints'
holds on its shard released, and with `purge` everything it owns deleted.

What a sink owns: its own topics (`<sink>.desired`, `.descs`, `.batches`, `.control`,
`.dead-letter`; never the shared `frontiers` and `sinks`), its keys on `frontiers` (tombstoned),
its write checkpoints (`sinks/<sink>/` in the bucket) and its shard (`shards/<shard>/`), unless
another sink's definition names that shard too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from confluent_kafka import Producer

from mvsink.core.errors import MvsinkError
from mvsink.core.messages import desired_progress_key, shard_upper_key
from mvsink.io.config import Config
from mvsink.io.kafka import client_config, delete_topics, sink_topics
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
