"""The settings are declared once (`mvsink.io.config.SETTINGS`): `Config` holds each of them,
and the settings tables of docs/operations.md are generated from them."""

from __future__ import annotations

import dataclasses
import re

import pytest

from mvsink.io.config import (
    ADVANCED_INTRO,
    GROUPED,
    LOCATIONS,
    REPO_ROOT,
    SETTINGS,
    SETTINGS_DOCS,
    TIMING_KEYS,
    CompactionPolicy,
    Config,
    S3Settings,
    Secret,
    Timing,
    Topics,
    settings_help,
    settings_table,
    with_settings_table,
)


@pytest.mark.parametrize("name", SETTINGS_DOCS)
def test_the_docs_hold_the_generated_settings_table(name: str) -> None:
    text = (REPO_ROOT / name).read_text()
    assert with_settings_table(text) == text, (
        f"{name}'s settings table differs from mvsink.io.config.SETTINGS; regenerate it with "
        "`.mvsink/venv/bin/python -m mvsink.io.config --write`"
    )


def test_config_holds_each_setting_once() -> None:
    paths = [setting.path for setting in SETTINGS]
    assert len(set(paths)) == len(paths)
    top = {path for path in paths if "." not in path}
    assert {field.name for field in dataclasses.fields(Config)} == top | {"topics", "s3"}
    s3 = {path.removeprefix("s3.") for path in paths if path.startswith("s3.")}
    assert {field.name for field in dataclasses.fields(S3Settings)} == s3


def test_config_defaults_are_the_declared_ones() -> None:
    for field in dataclasses.fields(Config):
        if field.default is not dataclasses.MISSING:
            declared = next(s for s in SETTINGS if s.path == field.name)
            assert field.default == declared.default, field.name


def test_every_setting_is_one_row_of_the_help_and_the_tables() -> None:
    names, envs = {s.name for s in SETTINGS}, {s.env for s in SETTINGS}
    assert len(names) == len(envs) == len(SETTINGS)
    rows = [line for line in settings_table().splitlines() if line.startswith("| `[")]
    assert len(rows) == len(SETTINGS)
    ordered = [s for s in SETTINGS if not s.advanced] + [s for s in SETTINGS if s.advanced]
    help_text = settings_help()
    for setting, row in zip(ordered, rows, strict=True):
        assert row.startswith(f"| `[{setting.section}] {setting.key}` | `{setting.env}`")
        assert f"  [{setting.section}] {setting.key} " in help_text
        assert "`" not in setting.summary


def test_the_advanced_settings_are_the_shards_time_bounds_in_a_table_of_their_own() -> None:
    advanced = [s for s in SETTINGS if s.advanced]
    assert {s.key for s in advanced} == TIMING_KEYS - {"poll_interval"}
    table = settings_table()
    first, _, second = table.partition(ADVANCED_INTRO)
    assert second, "no advanced settings table"
    assert all(
        f"`[shard] {s.key}`" in second and f"`[shard] {s.key}`" not in first for s in advanced
    )


def test_each_setting_is_one_row_of_config_and_builds_the_shards_bounds() -> None:
    # Config's fields are the rows: each setting's declaration is its field's metadata (or a
    # row of GROUPED for those Config groups), so adding a setting is adding its row.
    declared = [f.name for f in dataclasses.fields(Config) if "setting" in f.metadata]
    assert sorted(declared + [s.name for s in GROUPED]) == sorted(s.name for s in SETTINGS)
    config = Config(
        topics=Topics.for_sink("a"),
        kafka_bootstrap="k:9092",
        s3=S3Settings("h:1", "b", "r", Secret("k"), Secret("s"), False),
        shard_reader_lease=5.0,
        shard_max_attempt_age=7.0,
        compaction_max_batches=3,
    )
    assert config.shard_timing() == dataclasses.replace(
        Timing(), reader_lease=5.0, max_attempt_age=7.0
    )
    assert config.compaction_policy() == dataclasses.replace(CompactionPolicy(), max_batches=3)


def test_every_variable_the_library_reads_is_declared() -> None:
    # The variables the code reads by name are the settings' and LOCATIONS'; the compose
    # tooling's are the compose file's (it sets them, it does not read them).
    declared = {s.env for s in SETTINGS} | {f"{s.env}_FILE" for s in SETTINGS if s.secret}
    declared |= {env for env, _ in LOCATIONS}
    read = set()
    for path in [*(REPO_ROOT / "mvsink").rglob("*.py"), *(REPO_ROOT / "services").rglob("*.py")]:
        text = path.read_text()
        read |= set(re.findall(r"(?:environ\.get|getenv|environ\[)\(?\s*\"(MVSINK_\w+)\"", text))
    assert read <= declared, read - declared
