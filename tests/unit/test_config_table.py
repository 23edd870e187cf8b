"""The settings are declared once (`mvsink.io.config.SETTINGS`): `Config` holds each of them,
and the settings tables of README.md and docs/operations.md are generated from them."""

from __future__ import annotations

import dataclasses

import pytest

from mvsink.io.config import (
    REPO_ROOT,
    SETTINGS,
    SETTINGS_DOCS,
    Config,
    S3Settings,
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


def test_every_setting_is_one_row_of_the_help_and_the_table() -> None:
    names, envs = {s.name for s in SETTINGS}, {s.env for s in SETTINGS}
    assert len(names) == len(envs) == len(SETTINGS)
    rows = settings_table().splitlines()[2:]
    assert len(rows) == len(SETTINGS)
    help_text = settings_help()
    for setting, row in zip(SETTINGS, rows, strict=True):
        assert row.startswith(f"| `[{setting.section}] {setting.key}` | `{setting.env}`")
        assert f"  [{setting.section}] {setting.key} " in help_text
        assert "`" not in setting.summary
