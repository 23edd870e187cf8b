"""A replica is refused by its sink's definition (`mvsink.io.sinks.refusal`) exactly when a
shared setting differs, naming each on both sides, or when the sink was dropped."""

from __future__ import annotations

import dataclasses

import pytest

from mvsink.core.settings import Secret
from mvsink.io.config import Config, S3Settings, Topics
from mvsink.io.sinks import definition_of, refusal, sink_of

ROWS = "key string not null, value int64"


def config(**changes: object) -> Config:
    base = Config(
        sink_id="orders",
        shard_id="orders",
        topics=Topics.for_sink("orders"),
        kafka_bootstrap="k:9092",
        s3=S3Settings("h:1", "b", "r", Secret("k"), Secret("s"), False),
        row_schema=ROWS,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_a_replica_with_the_definitions_settings_is_served() -> None:
    defined = definition_of(config())
    assert refusal(config(), defined) is None
    # read-only, timing and other per-replica settings are the replica's own
    assert refusal(config(read_only=True, shard_reader_lease=9.0), defined) is None
    # the same rows spelled otherwise, or a replica that takes the shard's rows
    assert refusal(config(row_schema="key  string NOT NULL,value long"), defined) is None
    assert refusal(config(row_schema=""), defined) is None


@pytest.mark.parametrize(
    ("change", "ours", "theirs"),
    [
        ({"partitions": 5}, "partitions 5", "partitions 4"),
        ({"append_workers": 1}, "append_workers 1", "append_workers 2"),
        ({"partitioning": 1}, "partitioning 1", "partitioning 2"),
        ({"shard_id": "other"}, "shard_id other", "shard_id orders"),
        ({"as_of": 100}, "as_of 100", "as_of 0"),
        ({"retain_history": 7}, "retain_history 7", "retain_history 0"),
        (
            {"topics": Topics.for_sink("orders", frontiers="f2")},
            "frontiers_topic f2",
            "frontiers_topic frontiers",
        ),
        ({"row_schema": "key string not null"}, "row_schema key string not null", ROWS),
    ],
)
def test_each_shared_setting_that_differs_is_named_on_both_sides(
    change: dict[str, object], ours: str, theirs: str
) -> None:
    refused = refusal(config(**change), definition_of(config()))
    assert refused is not None
    mine, defined = refused.split(" disagree with ")
    assert ours in mine and theirs in defined, refused


def test_a_dropped_sink_refuses_every_replica() -> None:
    dropped = dataclasses.replace(definition_of(config()), dropped=True)
    refused = refusal(config(), dropped)
    assert refused is not None and "was dropped" in refused and "mvsink provision" in refused


def test_a_definition_read_back_is_the_config_it_was_written_from() -> None:
    other = config(partitions=7, append_workers=3, as_of=9, retain_history=4, shard_id="x")
    assert sink_of(config(), definition_of(other)) == dataclasses.replace(other, row_schema=ROWS)
