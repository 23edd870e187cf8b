"""Provisioning of one sink replica's topics (docs/design.md §3.1), its bucket, its schemas'
subjects (when the config names a Schema Registry: `mvsink.io.registry`), and (when the config
names a row schema) its shard, then the sink's definition on the sinks topic (`mvsink.io.sinks`),
which replaces the sink's earlier one. Idempotent; an existing shard with another schema, or a released
schema its subject's compatibility level refuses, is an error."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mvsink.io import registry
from mvsink.io.config import Config
from mvsink.io.kafka import ensure_topics, sink_topics
from mvsink.io.s3 import ensure_bucket, s3_client
from mvsink.io.sinks import define

if TYPE_CHECKING:
    from mvsink.shard import Shard

log = logging.getLogger("mvsink.tools.provision")


@dataclass(frozen=True)
class Provisioned:
    """What `provision` created this time (empty lists / False when all existed)."""

    topics_created: list[str]
    bucket_created: bool
    #: The shard's upper if the config names a row schema (the shard is created then).
    shard_upper: str | None = None
    #: The Schema Registry subjects provisioned (the config names a registry).
    subjects: tuple[str, ...] = ()


def provision(config: Config, frontiers_config: Mapping[str, str] | None = None) -> Provisioned:
    """Create whatever of the sink's topics, subjects and bucket is missing; check what exists.

    Raises:
        IncompatibleSchema: a released schema breaks its subject's compatibility level.
    """
    created = ensure_topics(config.kafka_bootstrap, sink_topics(config, frontiers_config))
    schemas = config.framing().registry
    subjects = tuple(schemas.provision(registry.topic_kinds(config.topics))) if schemas else ()
    bucket_created = ensure_bucket(s3_client(config.s3), config.s3.bucket)
    upper = None
    if config.row_schema:
        from mvsink.core.rows import parse_row_schema
        from mvsink.shard import open_shard

        shard = open_shard(
            config.shard_id,
            parse_row_schema(config.row_schema),
            config.s3,
            config.shard_timing(),
            config.retain_history,
        )
        ensure_retention(shard, config.retain_history)
        upper = str(shard.upper())
    define(config)
    return Provisioned(created, bucket_created, upper, subjects)


def ensure_retention(shard: Shard, retain_history: int) -> None:
    """Make the shard's `since` trail its upper by the sink's `retain_history` (a no-op when it
    already does). Done where a sink starts writing (provisioning, the append service)."""
    current = shard.state().retain_history
    if current != retain_history:
        shard.set_retain_history(retain_history)
        log.info("shard %s: retain_history %s -> %s", shard.shard_id, current, retain_history)
