"""Provisioning of one sink replica's topics (DESIGN §3.1), its bucket, and (when the config
names a row schema) its shard. Idempotent; an existing shard with another schema is an error."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mvsink.config import Config
from mvsink.kafka import ensure_topics, sink_topics
from mvsink.s3 import ensure_bucket, s3_client


@dataclass(frozen=True)
class Provisioned:
    """What `provision` created this time (empty lists / False when all existed)."""

    topics_created: list[str]
    bucket_created: bool
    #: The shard's upper if the config names a row schema (the shard is created then).
    shard_upper: str | None = None


def provision(config: Config, frontiers_config: Mapping[str, str] | None = None) -> Provisioned:
    """Create whatever of the sink's topics and bucket is missing; check what exists."""
    created = ensure_topics(config.kafka_bootstrap, sink_topics(config, frontiers_config))
    bucket_created = ensure_bucket(s3_client(config.s3), config.s3.bucket)
    upper = None
    if config.row_schema:
        from mvsink.rows import parse_row_schema
        from mvsink.shard import open_shard

        upper = str(
            open_shard(config.shard_id, parse_row_schema(config.row_schema), config.s3).upper()
        )
    return Provisioned(created, bucket_created, upper)
