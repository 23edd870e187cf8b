"""The compose deployment's Prometheus rules (`docker/prometheus/rules.yml`) are built on what the
code exports: every metric an expression selects is one a service defines (found in the source
of `mvsink` and `services`, with its labels), every label an expression matches, groups or joins
on exists there, every alert is well formed and covered by a promtool unit test
(`rules.test.yml`, run by the image build); and `mvsink compose verify`'s reading of
Prometheus's HTTP API (targets, rules, alerts). Pure: no promtool, no Prometheus.

PromQL is read with a small tokenizer, enough for these rules: selectors (`name{label="v"}`),
grouping and matching clauses (`by`, `without`, `on`, `ignoring`, `group_left`, `group_right`),
functions and aggregations, strings, numbers and range durations."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from mvsink.io.config import REPO_ROOT
from mvsink.tools.compose.verify import (
    SINK_SERIES,
    STUCK_ALERT,
    alert_state,
    describe_targets,
    rule_problems,
    target_health,
    targets_up,
)

PROMETHEUS = REPO_ROOT / "docker" / "prometheus"
RULES = PROMETHEUS / "rules.yml"
RULE_TESTS = PROMETHEUS / "rules.test.yml"
#: The series each metric type exposes (prometheus_client), by suffix of its name.
SUFFIXES = {
    "Counter": ("_total", "_created"),
    "Gauge": ("",),
    "Histogram": ("_bucket", "_sum", "_count", "_created"),
    "Summary": ("", "_sum", "_count", "_created"),
}
#: Labels Prometheus gives every scraped series.
TARGET_LABELS = {"job", "instance"}
#: Series Prometheus makes itself for every target.
PROMETHEUS_SERIES = {"up": set[str]()}
#: What the issue asks the alerts to cover: a sink not moving, a service not ready, dead
#: letters, compaction behind.
REQUIRED_ALERTS = {
    STUCK_ALERT,
    "MvsinkServiceNotReady",
    "MvsinkDeadLetters",
    "MvsinkCompactionBehind",
}
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
AGGREGATIONS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
    "topk", "quantile",
}  # fmt: skip
TOKEN = re.compile(
    r"""(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      |(?P<range>\[[^\]]*\])
      |(?P<braces>\{[^}]*\})
      |(?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
      |(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)
      |(?P<punct>!=|==|=~|!~|>=|<=|[-+*/%^(),<>=])
      |(?P<space>\s+)""",
    re.VERBOSE,
)
MATCHER = re.compile(r"""\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*,?""")


@dataclass
class Expression:
    """What a PromQL expression refers to."""

    #: metric name -> the labels its selectors match on
    selectors: dict[str, set[str]] = field(default_factory=dict)
    #: labels of its by/without/on/ignoring/group_left/group_right clauses
    grouping: set[str] = field(default_factory=set)
    functions: set[str] = field(default_factory=set)
    strings: set[str] = field(default_factory=set)


def parse(expr: str) -> Expression:
    """Selectors, grouping labels, functions and strings of `expr` (module docs)."""
    tokens: list[tuple[str, str]] = []
    at = 0
    while at < len(expr):
        match = TOKEN.match(expr, at)
        assert match is not None, f"cannot read {expr[at : at + 30]!r} in {expr!r}"
        at = match.end()
        kind = match.lastgroup or ""
        if kind != "space":
            tokens.append((kind, match.group()))
    found = Expression()
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        after = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if kind == "string":
            found.strings.add(text[1:-1])
        elif kind == "name" and text in GROUPING:
            if after == "(":
                close = next(j for j in range(i + 2, len(tokens)) if tokens[j][1] == ")")
                found.grouping |= {t for k, t in tokens[i + 2 : close] if k == "name"}
                i = close
        elif kind == "name" and (text in AGGREGATIONS or after == "("):
            found.functions.add(text)
        elif kind == "name" and text.lower() not in KEYWORDS:
            labels = found.selectors.setdefault(text, set())
            if tokens[i + 1 : i + 2] and tokens[i + 1][0] == "braces":
                body = tokens[i + 1][1][1:-1]
                assert MATCHER.sub("", body).strip() == "", f"unreadable matchers {body!r}"
                labels |= set(MATCHER.findall(body))
                i += 1
        elif kind == "braces":
            raise AssertionError(f"a selector without a metric name in {expr!r}")
        i += 1
    return found


def exported_metrics() -> dict[str, set[str]]:
    """Every series the code exports -> its labels: each `Counter`, `Gauge`, `Histogram` or
    `Summary` of prometheus_client created in `mvsink` or `services` with a literal name and
    literal label names."""
    series: dict[str, set[str]] = {}
    for path in sorted(
        [*REPO_ROOT.joinpath("mvsink").rglob("*.py"), *REPO_ROOT.joinpath("services").rglob("*.py")]
    ):
        tree = ast.parse(path.read_text(), str(path))
        if "prometheus_client" not in path.read_text():
            continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            if node.func.id not in SUFFIXES or not node.args:
                continue
            name = node.args[0]
            assert isinstance(name, ast.Constant) and isinstance(name.value, str), (
                f"{path}:{node.lineno}: a metric whose name is not a literal"
            )
            labels_node = node.args[2] if len(node.args) > 2 else None
            for keyword in node.keywords:
                if keyword.arg == "labelnames":
                    labels_node = keyword.value
            labels = set(ast.literal_eval(labels_node)) if labels_node is not None else set()
            base = name.value.removesuffix("_total") if node.func.id == "Counter" else name.value
            for suffix in SUFFIXES[node.func.id]:
                extra = {"le"} if suffix == "_bucket" else set()
                series[base + suffix] = labels | extra
    return series


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    return exported_metrics()


@pytest.fixture(scope="module")
def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _recorded(rules: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Each recording rule's name -> the labels of its result: its level, by Prometheus's naming
    convention `level:metric:operations` (`sink:...`: one series per sink, labelled `sink`)."""
    return {
        rule["record"]: set(rule["record"].split(":")[0].split("_"))
        for rule in rules
        if "record" in rule
    }


def test_the_code_exports_the_metrics_the_docs_name(exported: dict[str, set[str]]) -> None:
    """The finder works: known metrics with their labels (and the histogram's `le`)."""
    assert exported["mvsink_mint_persist_frontier"] == {"sink"}
    assert exported["mvsink_write_dead_letters_total"] == {"sink"}
    assert exported["mvsink_frontier_seconds_since_moved"] == {"service"}
    assert exported["mvsink_append_seconds_bucket"] == {"sink", "le"}
    assert "mvsink_write_dead_letters" not in exported  # a counter is exposed with `_total`


def test_every_rule_is_a_record_or_an_alert_with_a_unique_name(
    rules: list[dict[str, Any]],
) -> None:
    names = [rule.get("record") or rule.get("alert") for rule in rules]
    assert all(names) and len(set(names)) == len(names), names
    for rule in rules:
        assert ("record" in rule) != ("alert" in rule), rule
        if "record" in rule:
            assert re.fullmatch(r"[a-z_]+:mvsink_[a-z0-9_]+:[a-z0-9_]+", rule["record"]), rule
            assert set(rule) == {"record", "expr"}, rule
        else:
            assert re.fullmatch(r"Mvsink[A-Za-z]+", rule["alert"]), rule
            assert rule["labels"]["severity"] in ("warning", "critical"), rule
            assert {"summary", "description"} <= set(rule["annotations"]), rule


def test_every_metric_the_rules_use_is_exported_with_those_labels(
    rules: list[dict[str, Any]], exported: dict[str, set[str]]
) -> None:
    recorded = _recorded(rules)
    known = {**exported, **PROMETHEUS_SERIES}
    for rule in rules:
        name, expr = rule.get("record") or rule["alert"], parse(rule["expr"])
        assert expr.selectors, f"{name}: selects nothing"
        available = set(TARGET_LABELS) | expr.strings  # label_replace's target label is a string
        for metric, matched in expr.selectors.items():
            if ":" in metric:
                assert metric in recorded, f"{name}: {metric} is recorded by no rule"
                labels = recorded[metric]
                assert rules.index(rule) > [r.get("record") for r in rules].index(metric), (
                    f"{name}: uses {metric} before the rule recording it (same group, in order)"
                )
            else:
                assert metric in known, f"{name}: the code exports no {metric}"
                labels = known[metric] | TARGET_LABELS
            assert matched <= labels, f"{name}: {metric} has no label {matched - labels}"
            available |= labels
        assert expr.grouping <= available, f"{name}: no label {expr.grouping - available}"


def test_the_rules_alert_on_what_the_issue_asks() -> None:
    alerts = {
        r["alert"]
        for g in yaml.safe_load(RULES.read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    assert alerts >= REQUIRED_ALERTS


def test_verify_reads_rules_that_exist(rules: list[dict[str, Any]]) -> None:
    recorded = _recorded(rules)
    assert {series for _, series, _ in SINK_SERIES} <= set(recorded)
    assert all(recorded[series] == {"sink"} for _, series, _ in SINK_SERIES)
    assert STUCK_ALERT in {r.get("alert") for r in rules}


def test_every_alert_has_a_promtool_test_that_sees_it_fire(rules: list[dict[str, Any]]) -> None:
    """`rules.test.yml` (run by `promtool test rules` in the image build) loads these rules and
    expects every alert firing at least once, and the stuck-sink one also quiet before and
    after."""
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert tests["rule_files"] == [RULES.name]
    checks = [c for test in tests["tests"] for c in test.get("alert_rule_test", [])]
    fired = {c["alertname"] for c in checks if c["exp_alerts"]}
    assert fired == {r["alert"] for r in rules if "alert" in r}
    quiet = [
        c["eval_time"] for c in checks if c["alertname"] == STUCK_ALERT and not c["exp_alerts"]
    ]
    assert len(quiet) >= 2, quiet


def test_the_image_build_checks_the_rules_it_ships() -> None:
    """The build stage runs promtool on the files the runtime stage copies from it."""
    dockerfile = (PROMETHEUS / "Dockerfile").read_text().replace("\\\n", " ")
    assert "promtool check config /etc/prometheus/prometheus.yml" in dockerfile
    assert "promtool test rules rules.test.yml" in dockerfile
    assert "COPY --from=build /checked/ /etc/prometheus/" in dockerfile
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/rules.yml"]


def test_the_parser_finds_selectors_labels_and_functions() -> None:
    found = parse(
        'max by (sink) (a_total{job="x", sink!~"y"} * on (instance) group_left (sink) '
        "count by (instance, sink) (rate(b[1m]))) > 1e3 unless c == Inf"
    )
    assert found.selectors == {"a_total": {"job", "sink"}, "b": set(), "c": set()}
    assert found.grouping == {"sink", "instance"}
    assert found.functions == {"max", "count", "rate"}
    with pytest.raises(AssertionError):
        parse('{__name__="x"}')


# -- mvsink compose verify's reading of Prometheus's HTTP API ------------------------------------


def _target(job: str, health: str) -> dict[str, Any]:
    return {"labels": {"job": job, "instance": "10.0.0.2:9100"}, "health": health}


def test_targets_are_up_only_with_every_replica_up() -> None:
    want = {"mint": 1, "append": 2}
    data = {
        "activeTargets": [_target("mint", "up"), _target("append", "up"), _target("append", "down")]
    }
    health = target_health(data)
    assert health == {"append": ["down", "up"], "mint": ["up"]}
    assert not targets_up(health, want)
    assert describe_targets(health, want) == "mint 1/1 up, append 1/2 up (also down)"
    health["append"] = ["up", "up"]
    assert targets_up(health, want)
    assert not targets_up({"mint": ["up"]}, want)  # no append target found
    assert not targets_up({**health, "append": ["up", "up", "up"]}, want)  # a stale extra one


def test_rules_count_only_when_evaluated_cleanly() -> None:
    data = {
        "groups": [
            {
                "rules": [
                    {"name": "a", "health": "ok"},
                    {"name": "b", "health": "err", "lastError": "bad query"},
                    {"name": "c", "health": "unknown"},
                ]
            }
        ]
    }
    assert rule_problems(data) == (3, ["b: err bad query", "c: unknown"])


def test_the_stuck_alert_state_is_the_sinks_own() -> None:
    def alert(name: str, state: str, **labels: str) -> dict[str, Any]:
        return {"labels": {"alertname": name, "severity": "critical", **labels}, "state": state}

    other = alert(STUCK_ALERT, "firing", sink="other")
    missing = alert("MvsinkServiceMissing", "pending", job="append")
    assert alert_state({"alerts": [other]}, STUCK_ALERT, "verify")[0] == "inactive"
    pending = {"alerts": [other, missing, alert(STUCK_ALERT, "pending", sink="verify")]}
    assert alert_state(pending, STUCK_ALERT, "verify") == (
        "pending",
        [
            "MvsinkServiceMissing{job=append} pending",
            f"{STUCK_ALERT}{{sink=other}} firing",
            f"{STUCK_ALERT}{{sink=verify}} pending",
        ],
    )
    firing = {"alerts": [alert(STUCK_ALERT, "firing", sink="verify")]}
    assert alert_state(firing, STUCK_ALERT, "verify")[0] == "firing"
    assert alert_state({"alerts": []}, STUCK_ALERT, "verify") == ("inactive", [])
