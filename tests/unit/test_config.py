"""Configuration: sources and precedence, validation, and credentials kept out of files and logs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mvsink.core.errors import ConfigError
from mvsink.io.config import Secret, Topics, load_config
from mvsink.stack.state import ComponentRecord, credentials, save_records, stack_config, stack_home

ENDPOINTS = {
    "MVSINK_KAFKA_BOOTSTRAP": "127.0.0.1:9092",
    "MVSINK_S3_ENDPOINT": "127.0.0.1:9000",
    "MVSINK_S3_ACCESS_KEY": "AKID",
    "MVSINK_S3_SECRET_KEY": "very-secret-value",
}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """An environment with endpoints set and a state dir that has no running stack."""
    return {**ENDPOINTS, "MVSINK_STATE_DIR": str(tmp_path / "state")}


def test_defaults(env: dict[str, str]) -> None:
    config = load_config(env=env)
    assert (config.sink_id, config.partitions, config.append_workers, config.as_of) == (
        "demo",
        4,
        2,
        0,
    )
    assert config.topics == Topics(
        "demo.desired",
        "demo.descs",
        "demo.batches",
        "demo.control",
        "frontiers",
        "demo.dead-letter",
    )
    assert config.s3.access_key.reveal() == "AKID"
    assert config.spark_master == "local[*]"


def test_file_then_env_precedence(env: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "sink.toml"
    path.write_text(
        '[sink]\nid = "orders"\npartitions = 8\nread_only = true\n[s3]\nbucket = "lake"\n'
    )
    config = load_config(path, env={**env, "MVSINK_PARTITIONS": "16"})
    assert config.sink_id == "orders"
    assert config.topics.descs == "orders.descs"
    assert config.partitions == 16  # env wins over the file
    assert config.read_only is True
    assert config.s3.bucket == "lake"


def test_config_file_from_env_variable(env: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "sink.toml"
    path.write_text("[sink]\nappend_workers = 3\n")
    assert load_config(env={**env, "MVSINK_CONFIG": str(path)}).append_workers == 3


@pytest.mark.parametrize("key", ["access_key", "secret_key"])
def test_credentials_in_a_config_file_are_refused(
    env: dict[str, str], tmp_path: Path, key: str
) -> None:
    path = tmp_path / "sink.toml"
    path.write_text(f'[s3]\n{key} = "oops"\n')
    with pytest.raises(ConfigError, match="is a credential"):
        load_config(path, env=env)


def test_credentials_from_secret_files(env: dict[str, str], tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("from-file\n")
    config = load_config(env={**env, "MVSINK_S3_SECRET_KEY_FILE": str(secret)})
    assert config.s3.secret_key.reveal() == "from-file"


def test_missing_secret_file_is_a_clear_error(env: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="MVSINK_S3_SECRET_KEY_FILE"):
        load_config(env={**env, "MVSINK_S3_SECRET_KEY_FILE": str(tmp_path / "nope")})


def test_secrets_never_print(env: dict[str, str]) -> None:
    config = load_config(env=env)
    assert "very-secret-value" not in repr(config)
    assert "very-secret-value" not in str(config.s3)
    assert repr(Secret("x")) == "Secret(****)"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"MVSINK_PARTITIONS": "0"}, "partitions"),
        ({"MVSINK_PARTITIONS": "four"}, "MVSINK_PARTITIONS"),
        ({"MVSINK_APPEND_WORKERS": "0"}, "append_workers"),
        ({"MVSINK_AS_OF": "-1"}, "as_of"),
        ({"MVSINK_READ_ONLY": "maybe"}, "boolean"),
        ({"MVSINK_SINK_ID": "has space"}, "sink_id"),
        ({"MVSINK_KAFKA_BOOTSTRAP": ""}, "bootstrap"),
        ({"MVSINK_RETAIN_HISTORY": "-1"}, "retain_history"),
        ({"MVSINK_SHARD_VERSION_GRACE": "40"}, "version_grace"),  # <= attempt age + timeout
        ({"MVSINK_SHARD_PART_GRACE": "100"}, "part_grace"),  # > version_grace
        ({"MVSINK_SHARD_MAX_BATCHES": "1"}, "max_batches"),
        ({"MVSINK_SHARD_COMPACTION": "sometimes"}, "boolean"),
        ({"MVSINK_KAFKA_MAX_POLL_INTERVAL": "5"}, "max_poll_interval.*group session"),
        ({"MVSINK_KAFKA_MAX_POLL_INTERVAL": "90000"}, "max_poll_interval.*librdkafka"),
    ],
)
def test_invalid_settings_name_the_setting(
    env: dict[str, str], override: dict[str, str], message: str
) -> None:
    values = {**env, **override}
    if override.get("MVSINK_KAFKA_BOOTSTRAP") == "":
        del values["MVSINK_KAFKA_BOOTSTRAP"]
    with pytest.raises(ConfigError, match=message):
        load_config(env=values)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[sink]\nbogus = 1\n", "unknown setting"),
        ("[sink\n", "not valid TOML"),
        ("sink = 1\n", "must be a table"),
        ('[sink]\npartitions = "x"\n', "partitions"),
    ],
)
def test_bad_config_files(env: dict[str, str], tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "sink.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path, env=env)


def test_missing_config_file(env: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.toml", env=env)


def test_config_env_loads_back_the_same_config(env: dict[str, str]) -> None:
    """Every setting reaches a child process (services started by the demo and the benches)."""
    from mvsink.io.config import config_env

    config = load_config(
        env={
            **env,
            "MVSINK_RETAIN_HISTORY": "7",
            "MVSINK_SHARD_COMPACTION": "false",
            "MVSINK_SHARD_PART_GRACE": "2.5",
            "MVSINK_PARTITIONS": "3",
        }
    )
    again = load_config(env={"MVSINK_STATE_DIR": env["MVSINK_STATE_DIR"], **config_env(config)})
    assert again == config
    assert (again.retain_history, again.compaction, again.shard_timing().part_grace) == (
        7,
        False,
        2.5,
    )


def test_passed_endpoints_sit_above_the_defaults_and_below_the_file_and_the_environment(
    env: dict[str, str], tmp_path: Path
) -> None:
    # The loader discovers nothing itself: the embedded stack's endpoints come in as `endpoints`.
    path = tmp_path / "sink.toml"
    path.write_text('[s3]\nbucket = "lake"\n')
    endpoints = {"s3_bucket": "stack", "s3_region": "stack-region", "kafka_bootstrap": "s:1"}
    config = load_config(path, env=env, endpoints=endpoints)
    assert config.s3.bucket == "lake"  # the file wins
    assert config.kafka_bootstrap == env["MVSINK_KAFKA_BOOTSTRAP"]  # the environment wins
    assert config.s3.region == "stack-region"  # over the default
    with pytest.raises(ConfigError, match="unknown endpoint settings"):
        load_config(env=env, endpoints={"kafka": "s:1"})


def test_stack_config_injects_the_running_stacks_endpoints(tmp_path: Path) -> None:
    state = tmp_path / "state"
    home = stack_home(state)
    alive = {"pid": os.getpid(), "ports": {}, "log": ""}
    save_records(
        home,
        {
            "kafka": ComponentRecord("kafka", address="127.0.0.1:19092", **alive),
            "minio": ComponentRecord("minio", address="127.0.0.1:19000", **alive),
        },
    )
    env = {"MVSINK_STATE_DIR": str(state)}
    with pytest.raises(ConfigError, match="kafka bootstrap servers not set"):
        load_config(env=env)  # no discovery in the loader
    config = stack_config(env=env)
    assert (config.kafka_bootstrap, config.s3.endpoint) == ("127.0.0.1:19092", "127.0.0.1:19000")
    assert config.s3.access_key.reveal() == credentials(home)[0]
