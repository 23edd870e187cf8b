"""Provisioning of one sink replica's topics (DESIGN §3.1) and its shard bucket. Idempotent."""

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


def provision(config: Config, frontiers_config: Mapping[str, str] | None = None) -> Provisioned:
    """Create whatever of the sink's topics and bucket is missing; check what exists."""
    created = ensure_topics(config.kafka_bootstrap, sink_topics(config, frontiers_config))
    bucket_created = ensure_bucket(s3_client(config.s3), config.s3.bucket)
    return Provisioned(created, bucket_created)
