"""What `mvsink.io.spark.packed_env` packs for bare executors and how it names the archive:
the distributions mvsink needs, as installed (requirements followed with their extras, the
cluster's own Spark and driver-only tools left out), and a key that changes with any of them
or with the Python."""

from __future__ import annotations

import importlib.metadata
import re
import sys

import pytest

from mvsink.core.errors import ConfigError
from mvsink.io import spark
from mvsink.io.spark import NOT_PACKED, pack_key, packed_distributions, packed_env


class FakeDistribution:
    """Just what `packed_distributions` reads of a distribution."""

    def __init__(self, version: str, *requires: str) -> None:
        self.version = version
        self.requires = list(requires)


def test_requirements_are_followed_with_their_extras_and_without_the_clusters_spark(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    installed = {
        "root": FakeDistribution(
            "1",
            "Lib-A[fast]>=1",
            "dev-tool; extra == 'dev'",
            "windows-only; sys_platform == 'win32'",  # not installed: skipped
            "pyspark==4.1.3",
            "matplotlib>=3",
        ),
        "lib-a": FakeDistribution(
            "2", 'speedups; extra == "fast"', "slowdowns; extra == 'slow'", "common"
        ),
        "speedups": FakeDistribution("3"),
        "slowdowns": FakeDistribution("4"),
        "common": FakeDistribution("5"),
        "dev-tool": FakeDistribution("6"),
        "pyspark": FakeDistribution("4.1.3", "py4j==0.10.9.9", "only-for-spark"),
        "py4j": FakeDistribution("0.10.9.9"),
        "only-for-spark": FakeDistribution("7"),
        "matplotlib": FakeDistribution("3.9", "common", "only-for-charts"),
        "only-for-charts": FakeDistribution("8"),
    }

    def distribution(name: str) -> FakeDistribution:
        key = name.lower().replace("_", "-")
        if key not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[key]

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    found = packed_distributions("root")
    assert sorted(found) == ["common", "lib-a", "speedups"]


def test_the_running_environment_packs_the_executors_libraries_and_not_spark() -> None:
    names = set(packed_distributions())
    assert {"pyarrow", "confluent-kafka", "minio", "fastavro", "numpy", "pandas"} <= names
    assert not names & NOT_PACKED
    # mvsink asks for confluent-kafka[schemaregistry]: that extra's requirements come along
    registry = {
        _normal(re.split(r"[\s\[<>=!~;(]", requirement, maxsplit=1)[0])
        for requirement in importlib.metadata.distribution("confluent-kafka").requires or []
        if "schemaregistry" in requirement.partition(";")[2]
    }
    assert registry & names
    assert {n for n in registry if _installed(n)} <= names


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_the_key_names_the_python_its_installation_and_every_packed_version() -> None:
    versions = {"pyarrow": "26.0.1", "minio": "7.2.20"}
    key = pack_key("cpython-3.11.7-linux-x86_64", "/usr", versions)
    assert key == pack_key("cpython-3.11.7-linux-x86_64", "/usr", dict(reversed(versions.items())))
    assert len(key) == 16
    others = {
        pack_key("cpython-3.12.1-linux-x86_64", "/usr", versions),
        pack_key("cpython-3.11.7-linux-x86_64", "/opt/python", versions),
        pack_key("cpython-3.11.7-linux-x86_64", "/usr", {**versions, "pyarrow": "26.0.2"}),
        pack_key("cpython-3.11.7-linux-x86_64", "/usr", {**versions, "fastavro": "1.13.1"}),
    }
    assert key not in others and len(others) == 4


def test_the_key_changes_with_the_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    before = pack_key("cpython-3.11.7-linux-x86_64", "/usr", {"minio": "7.2.20"})
    monkeypatch.setattr(spark, "PACK_LAYOUT", spark.PACK_LAYOUT + 1)
    assert pack_key("cpython-3.11.7-linux-x86_64", "/usr", {"minio": "7.2.20"}) != before


def test_packing_needs_a_virtualenv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "base_prefix", sys.prefix)
    with pytest.raises(ConfigError, match=r"pack_env: .* does not run in a virtualenv"):
        packed_env()
