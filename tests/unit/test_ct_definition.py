"""Continual task definitions (`mvsink.io.ct_definition`): the examples load, and every kind of
bad definition is refused with an error that names what is wrong."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from mvsink.core.errors import ConfigError
from mvsink.io.ct_definition import definition_from_toml, load_definition
from mvsink.tools.ct_demo import EVALUATIONS, EXAMPLES

GOOD = """
name = "t"
logic = ["DELETE FROM out WHERE a > :time", "insert into out select a from src"]
[inputs]
src = "in-shard"
[output]
name = "out"
shard = "out-shard"
schema = "a long not null"
"""


@pytest.mark.parametrize("example", sorted(p.stem for p in EXAMPLES.glob("*.toml")))
def test_the_examples_load(example: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MVSINK_SHARD_ID", raising=False)
    definition = load_definition(EXAMPLES / f"{example}.toml")
    assert definition.name == example and definition.logic and definition.as_of == 0
    if example in EVALUATIONS:  # the demo's: over its orders
        assert definition.inputs == {"orders": "demo-orders"} and not definition.snapshot
    else:  # milestones, over the view sink's shard
        assert definition.inputs == {"totals": "demo"} and definition.snapshot


def test_statements_are_told_apart_in_any_case() -> None:
    definition = definition_from_toml(tomllib.loads(GOOD))
    delete, insert = definition.logic
    assert (delete.insert, delete.query) == (False, "a > :time")
    assert (insert.insert, insert.query) == (True, "select a from src")
    no_where = GOOD.replace("DELETE FROM out WHERE a > :time", "DELETE FROM out;")
    assert definition_from_toml(tomllib.loads(no_where)).logic[0].query == "TRUE"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('"t"', '"bad name!"'), "name='bad name!'"),
        (('"DELETE FROM out WHERE a > :time"', '"UPDATE out SET a = 1"'), "use INSERT INTO out"),
        (('"DELETE FROM out WHERE a > :time"', '"DELETE FROM src"'), "writes 'src'"),
        (("logic = [", "logic = [] #"), "logic must be a non-empty list"),
        (('src = "in-shard"', 'src = "out-shard"'), "output shard 'out-shard' must be"),
        (('src = "in-shard"', 'out = "in-shard"'), "must differ"),
        (('src = "in-shard"', 'src_retractions = "x"\nsrc = "in-shard"'), "must differ"),
        (('src = "in-shard"', '"a b" = "in-shard"'), "is not a SQL name"),
        (('src = "in-shard"', 'src = "in/shard"'), "is not a shard id"),
        (('schema = "a long not null"', 'schema = "a decimal"'), "unknown type"),
        (('name = "out"', 'nam = "out"'), "[output] needs exactly name, shard and schema"),
        (('name = "t"', 'name = "t"\nas_of = -1'), "as_of must be an integer >= 0"),
        (('name = "t"', 'name = "t"\nsnapshot = "yes"'), "snapshot must be true or false"),
        (('name = "t"', 'name = "t"\nreferneces = {}'), "unknown keys ['referneces']"),
        (('[inputs]\nsrc = "in-shard"', "[inputs]"), "[inputs] needs at least one"),
    ],
)
def test_a_bad_definition_is_refused_by_name(change: tuple[str, str], message: str) -> None:
    old, new = change
    assert old in GOOD
    with pytest.raises(ConfigError) as error:
        definition_from_toml(tomllib.loads(GOOD.replace(old, new, 1)), "t.toml")
    assert message in str(error.value) and str(error.value).startswith("t.toml")


def test_a_missing_or_broken_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml does not exist"):
        load_definition(tmp_path / "nope.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("name = \n")
    with pytest.raises(ConfigError, match=r"broken\.toml"):
        load_definition(broken)


@pytest.mark.parametrize(
    ("written", "env", "expected"),
    [
        ("${SHARD}", {"SHARD": "view-1"}, "view-1"),
        ("${SHARD:-demo}", {}, "demo"),
        ("${SHARD:-demo}", {"SHARD": "v2"}, "v2"),
        ("pre-${A}-${B:-b}", {"A": "a"}, "pre-a-b"),
    ],
)
def test_shard_ids_name_environment_variables(
    written: str, env: dict[str, str], expected: str
) -> None:
    text = GOOD.replace('src = "in-shard"', f'src = "{written}"')
    assert definition_from_toml(tomllib.loads(text), env=env).inputs == {"src": expected}


def test_an_unset_variable_without_a_default_is_refused() -> None:
    text = GOOD.replace('shard = "out-shard"', 'shard = "${OUT}"')
    with pytest.raises(ConfigError, match=r"names \$\{OUT\}, which is not set"):
        definition_from_toml(tomllib.loads(text), "t.toml", env={})
