"""The pure parts of `mvsink compose verify` and of making the base image: reading work out of
the services' logs, the phase table, the Spark cluster's spread, the project's variables,
trimming a debootstrapped tree, the build environment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mvsink.io.config import REPO_ROOT
from mvsink.tools.compose import engine
from mvsink.tools.compose.verify import (
    APPEND_WORK,
    LOG_LINE,
    SCALE,
    WRITE_WORK,
    Phases,
    _deployment,
    _work,
    last_lines,
    spread,
)

WRITE_LOGS = {
    "v-write-1": [
        "INFO desired partitions assigned: [0, 1, 2, 3] (checkpoints {})",
        "INFO launching 2 residents on ['0', '1'] at write-1:41233",
        "INFO staged desc[0, 1): partitions [0, 1, 2, 3], 4 parts",
        "WARNING resident 1/1 failed (EOFError()): partitions [1, 3] run as a one-shot job",
        "WARNING desc[1, 2) staged 9s ago and still not appended: staging it again",
        "INFO desired partitions revoked: [0, 1, 2, 3]",
        "INFO desired partitions assigned: [0, 1] (checkpoints {})",
        "INFO staged desc[1, 2): partitions [0, 1], 2 parts",
    ],
    "v-write-2": ["INFO desired partitions assigned: [] (checkpoints {})"],
}


def test_work_reads_the_last_assignment_and_counts_the_work() -> None:
    figures = _work(WRITE_LOGS, "desired partitions assigned: ", WRITE_WORK)
    assert figures["v-write-1"] == {"holds": [0, 1], "done": 2, "crews": 1, "handed_back": 1}
    assert figures["v-write-2"] == {"holds": [], "done": 0, "crews": 0, "handed_back": 0}


@pytest.mark.parametrize(
    ("line", "container", "text"),
    [
        ("proj-write-1  | INFO staged x", "proj-write-1", "INFO staged x"),
        ("proj-append-2 | appended 3 parts", "proj-append-2", "appended 3 parts"),
    ],
)
def test_log_lines_split_into_container_and_text(line: str, container: str, text: str) -> None:
    match = LOG_LINE.match(line)
    assert match is not None and (match["container"], match["text"]) == (container, text)


def test_a_diagnosis_keeps_each_containers_last_lines_but_the_per_task_noise() -> None:
    logs = {  # as `Deployment.logs` reads them
        "p-write-1": [
            "26/11/24 09:53:52 INFO TaskSetManager: Finished task 0.0 in stage 3.0",
            "INFO staged desc 0.1",
            "   ",
            "WARNING resident 1/0 failed",
            "INFO staged desc 0.2",
        ],
        "p-write-2": ["INFO staged desc 0.1"],
        "p-kafka-1": ["INFO [TransactionCoordinator id=1] Initialized transactionalId v.p0"],
    }
    assert last_lines(logs, 2) == {
        "p-write-1": ["WARNING resident 1/0 failed", "INFO staged desc 0.2"],
        "p-write-2": ["INFO staged desc 0.1"],
    }


def test_phases_time_each_phase_and_total(capsys: pytest.CaptureFixture[str]) -> None:
    said: list[str] = []
    phases = Phases(said.append)
    with phases.phase("build"):
        pass
    with pytest.raises(RuntimeError), phases.phase("up"):
        raise RuntimeError("boom")
    assert list(phases.seconds) == ["build", "up"]  # a failed phase is timed too
    table = phases.table()
    assert "build" in table and "up" in table and "total" in table
    assert said[0] == "[compose] build ..." and said[1].startswith("[compose] build: done in")


def test_slim_trims_a_debootstrapped_tree(tmp_path: Path) -> None:
    root = tmp_path
    for name in (
        "var/cache/apt/archives/a.deb",
        "var/lib/apt/lists/x_Packages",
        "usr/share/man/man1/ls.1.gz",
        "usr/share/doc/bash/README",
        "usr/share/doc/bash/copyright",
        "usr/share/locale/de/LC_MESSAGES/x.mo",
        "usr/share/locale/locale.alias",
        "etc/apt/sources.list",
        "usr/bin/bash",
    ):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x")
    (root / "etc/apt/sources.list").write_text("deb http://mirror.example/debian bookworm main\n")
    (root / "etc/dpkg/dpkg.cfg.d").mkdir(parents=True)
    (root / "etc/apt/apt.conf.d").mkdir(parents=True)
    (root / "etc/apt/sources.list.d").mkdir(parents=True)
    engine._slim(root)
    kept = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    assert kept == {
        "usr/share/doc/bash/copyright",
        "usr/share/locale/locale.alias",
        "usr/bin/bash",
        "etc/dpkg/dpkg.cfg.d/docker-slim",
        "etc/apt/sources.list.d/debian.sources",
        "etc/apt/apt.conf.d/docker-clean",
        "etc/apt/apt.conf.d/docker-no-languages",
    }
    assert "/var/cache/apt/archives/*.deb" in (root / "etc/apt/apt.conf.d/docker-clean").read_text()
    assert "path-exclude /usr/share/doc/*" in (root / "etc/dpkg/dpkg.cfg.d/docker-slim").read_text()
    sources = (root / "etc/apt/sources.list.d/debian.sources").read_text()
    assert "URIs: http://mirror.example/debian\n" in sources
    assert "URIs: http://mirror.example/debian-security\n" in sources
    assert "bookworm-security" in sources and "bookworm-updates" in sources


def test_build_env_carries_the_extra_certificates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "EXTRA_CA_DIR", tmp_path)
    monkeypatch.delenv("MVSINK_BUILD_CA", raising=False)
    assert "MVSINK_BUILD_CA" not in engine.build_env()
    (tmp_path / "b.crt").write_text("-----BEGIN CERTIFICATE-----\nB\n-----END CERTIFICATE-----\n")
    (tmp_path / "a.crt").write_text("-----BEGIN CERTIFICATE-----\nA\n-----END CERTIFICATE-----\n")
    bundle = engine.build_env()["MVSINK_BUILD_CA"]
    assert bundle.index("\nA\n") < bundle.index("\nB\n") and bundle.count("BEGIN") == 2


def test_work_patterns_match_work_and_not_warnings() -> None:
    assert WRITE_WORK.search("INFO staged desc[3, 4): partitions [1], 1 parts, 7 updates in 0.2s")
    assert not WRITE_WORK.search("WARNING desc[3, 4) staged 9s ago and still not appended")
    assert APPEND_WORK.search("INFO appended 2 parts for desc[3, 4) (seqno 9) in 3.1 ms")
    assert not APPEND_WORK.search("WARNING desc[3, 4) staged 9s ago and still not appended: x")


def _cluster(workers: dict[str, list[str]], apps: list[str]) -> dict[str, object]:
    return {
        "alive": sorted(workers),
        "workers": {w: {"container": f"c-{w}", "apps": a} for w, a in workers.items()},
        "apps": dict.fromkeys(apps, 2),
    }


def test_spread_wants_every_write_application_on_every_worker() -> None:
    both = _cluster({"w1": ["a1", "a2"], "w2": ["a1", "a2", "other"]}, ["a1", "a2"])
    assert spread(both, workers=2, writers=2)
    assert not spread(both, workers=1, writers=2)  # a worker too many (one just killed)
    assert not spread(both, workers=2, writers=3)  # a write driver with no application yet
    one_sided = _cluster({"w1": ["a1", "a2"], "w2": ["a1"]}, ["a1", "a2"])
    assert not spread(one_sided, workers=2, writers=2)
    unseen = {**both, "alive": ["w1", "w2", "w3"]}  # ALIVE at the master, no container shows it
    assert not spread(unseen, workers=3, writers=2)


def test_the_project_sets_only_variables_the_compose_file_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every variable the verification sets for `docker compose` is one the compose file reads;
    its own knobs (ports, Spark cores) do not reach the host-side configuration."""
    for name in [n for n in os.environ if n.startswith("MVSINK_")]:
        monkeypatch.delenv(name)
    deployment = _deployment(lambda _: None)
    compose = (REPO_ROOT / "docker-compose.yaml").read_text()
    for name in deployment.env:
        if name.startswith("MVSINK_") and name != "MVSINK_BUILD_CA":
            assert f"${{{name}:" in compose, name
    assert deployment.env["MVSINK_SPARK_WORKER_CORES"] == str(SCALE["spark-worker"])
    assert deployment.spark_ui_port == int(deployment.env["MVSINK_SPARK_UI_HOST_PORT"])
    assert deployment.config.kafka_bootstrap.startswith("127.0.0.1:")
