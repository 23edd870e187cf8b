"""docker-compose.yaml is a valid Compose file whose services run real entry points of this
project, scale without clashes, and are configured only through settings `mvsink.config` knows;
every image it runs is built from this repository (no pulls), as a non-root user, at the versions
the embedded stack runs. (`./run compose-test` runs the file for real: `mvsink.compose.verify`.)

The file is validated by the real `docker compose config` where a Docker engine with compose v2
answers, and always against the Compose Specification schema the project keeps in
`tests/compose/` (source, digest and licence in its README): never skipped."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
from typing import Any

import jsonschema
import pytest
import yaml

from mvsink.cli import build_parser
from mvsink.config import FIELDS, REPO_ROOT
from mvsink.stack.kafka import KAFKA_VERSION
from mvsink.stack.minio import MINIO_VERSION

SCALED = ("mint", "write", "append")


SPEC = REPO_ROOT / "tests" / "compose" / "compose-spec.json"
#: The digest tests/compose/README.md records for the copy.
SPEC_SHA256 = "1f91e091f16b2dd50ab8860e02bb391d22df553d91c145eacedb1b6eff9c3f0e"


def _docker_compose() -> list[str] | None:
    """`docker compose` if a Docker CLI with compose v2 is installed, else None."""
    docker = shutil.which("docker")
    if docker is None:
        return None
    try:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [docker, "compose"] if probe.returncode == 0 else None


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((REPO_ROOT / "docker-compose.yaml").read_text()))


def test_compose_file_matches_the_compose_specification(compose: dict[str, Any]) -> None:
    """The schema, always; and Compose itself where installed (it interpolates and checks more
    than the schema)."""
    schema = json.loads(SPEC.read_text())
    jsonschema.Draft7Validator(schema).validate(compose)
    command = _docker_compose()
    if command is not None:
        env = {**os.environ, "MVSINK_S3_ACCESS_KEY": "key", "MVSINK_S3_SECRET_KEY": "secret"}
        result = subprocess.run([*command, "-f", str(REPO_ROOT / "docker-compose.yaml"), "config",
                                 "-q"], capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
        assert result.returncode == 0, result.stderr


def test_the_schema_copy_is_the_recorded_one() -> None:
    assert hashlib.sha256(SPEC.read_bytes()).hexdigest() == SPEC_SHA256
    assert SPEC_SHA256 in (SPEC.parent / "README.md").read_text()


def test_compose_has_every_component(compose: dict[str, Any]) -> None:
    assert {"kafka", "minio", *SCALED} <= set(compose["services"])
    for name in ("kafka", "minio", *SCALED):
        assert "healthcheck" in compose["services"][name], name


def _runnable(module: str) -> bool:
    """Whether `python -m module` would find something to run."""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return False
    if spec is None:
        return False
    if spec.submodule_search_locations is not None:  # a package runs its __main__
        return importlib.util.find_spec(f"{module}.__main__") is not None
    return True


def _check_entry_point(command: list[str]) -> None:
    if command[:2] == ["python", "-m"]:
        assert _runnable(command[2]), f"`{' '.join(command)}`: nothing to run"
    elif command[0] == "mvsink":
        build_parser().parse_args(command[1:])  # SystemExit on an unknown subcommand
    else:
        raise AssertionError(f"`{' '.join(command)}` is not an mvsink entry point")


def test_every_service_command_is_a_real_entry_point(compose: dict[str, Any]) -> None:
    ours = {
        n: s for n, s in compose["services"].items() if s["build"]["dockerfile"] == "Dockerfile"
    }
    assert set(SCALED) <= set(ours)
    for name, service in ours.items():
        assert isinstance(service.get("command"), list), f"{name}: command must be an exec list"
        _check_entry_point(service["command"])


def test_entry_point_check_rejects_what_does_not_exist() -> None:
    with pytest.raises(AssertionError):
        _check_entry_point(["python", "-m", "services.nonexistent"])
    with pytest.raises(AssertionError):
        _check_entry_point(["python", "-m", "services"])  # a package without __main__
    with pytest.raises(SystemExit):
        _check_entry_point(["mvsink", "no-such-command"])


def test_scaled_services_have_no_fixed_names_or_host_ports(compose: dict[str, Any]) -> None:
    for name in SCALED:
        service = compose["services"][name]
        assert "container_name" not in service, name
        assert "ports" not in service, name


def test_service_settings_are_known_to_the_config(compose: dict[str, Any]) -> None:
    known = {f.env for f in FIELDS}
    for name in ("provision", *SCALED):
        env = compose["services"][name]["environment"]
        unknown = {k for k in env if k.startswith("MVSINK_")} - known
        assert not unknown, f"{name}: settings mvsink.config does not read: {unknown}"


def test_the_schema_check_rejects_an_invalid_compose_file() -> None:
    schema = json.loads(SPEC.read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate({"services": {"mint": {"comand": ["x"]}}})


def test_service_healthchecks_ask_readiness_on_the_metrics_port(compose: dict[str, Any]) -> None:
    for name in SCALED:
        service = compose["services"][name]
        port = service["environment"]["MVSINK_METRICS_PORT"]
        command = " ".join(service["healthcheck"]["test"])
        assert f"http://127.0.0.1:{port}/readyz" in command, (name, command)


def test_every_image_is_built_here(compose: dict[str, Any]) -> None:
    """Nothing is pulled: each service names the image its `build` makes."""
    for name, service in compose["services"].items():
        assert "build" in service, f"{name} would pull {service.get('image')}"
        dockerfile = REPO_ROOT / service["build"]["context"] / service["build"]["dockerfile"]
        assert dockerfile.exists(), name
        assert set(service["build"]["args"]) == {"BASE", "BUILD_CA"}, name


def _stages(dockerfile: str) -> list[list[str]]:
    """The instructions of each stage (continuation lines joined)."""
    text = (REPO_ROOT / dockerfile).read_text().replace("\\\n", " ")
    stages: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("FROM "):
            stages.append([])
        if line and not line.startswith("#") and stages:
            stages[-1].append(line)
    return stages


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "docker/kafka/Dockerfile",
                                        "docker/minio/Dockerfile"])  # fmt: skip
def test_images_are_multi_stage_and_run_as_a_user(dockerfile: str) -> None:
    stages = _stages(dockerfile)
    assert len(stages) == 2, "a build stage and a runtime stage"
    runtime = stages[-1]
    users = [line.split()[1] for line in runtime if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0"), dockerfile
    assert not any("BUILD_CA" in line or "trust-build-ca" in line for line in runtime), (
        "the build CA stays in the build stage"
    )
    assert not any(tool in line for line in runtime for tool in ("maven", "golang", "curl ")), (
        "no build tools in the runtime image"
    )


def test_images_run_the_versions_the_embedded_stack_runs(compose: dict[str, Any]) -> None:
    assert compose["services"]["kafka"]["image"].endswith(f":{KAFKA_VERSION}")
    minio = (REPO_ROOT / "docker/minio/Dockerfile").read_text()
    assert f"ARG MINIO_VERSION={MINIO_VERSION}\n" in minio
    commit_date = MINIO_VERSION.split("-")[1][:8]
    assert compose["services"]["minio"]["image"].endswith(f":{commit_date}")


def test_only_kafka_and_minio_publish_ports_and_only_on_loopback(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert name in ("kafka", "minio"), name
            assert str(port).startswith("127.0.0.1:"), (name, port)


def test_the_host_listener_is_advertised_on_the_published_port(compose: dict[str, Any]) -> None:
    kafka = compose["services"]["kafka"]
    (published,) = kafka["ports"]
    host_port = published.rsplit(":", 1)[0].split(":", 1)[1]  # 127.0.0.1:<this>:19092
    assert f"HOST://127.0.0.1:{host_port}" in kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert (
        published.endswith(":19092") and "HOST://:19092" in kafka["environment"]["KAFKA_LISTENERS"]
    )


def test_healthchecks_test_readiness(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services["kafka"]["healthcheck"]["test"][1:3] == ["kafka-tool", "broker-api-versions"]
    assert services["minio"]["healthcheck"]["test"] == ["CMD", "minio-ready"]
    ready = (REPO_ROOT / "docker/minio/minio-ready").read_text()
    assert "/minio/health/ready" in ready
