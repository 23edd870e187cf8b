"""docker-compose.yaml is a valid Compose file whose services run real entry points of this
project (or the Spark daemons of the PySpark it installs), scale without clashes, and are
configured only through settings `mvsink` reads; every image it runs is built from this
repository (no pulls), as a non-root user, at the versions the embedded stack runs; the write
drivers run their executors on the file's Spark cluster; Prometheus scrapes every service that
serves metrics. (`./run compose-test` runs the file for real: `mvsink.tools.compose.verify`.)

The file is validated by the real `docker compose config` where a Docker engine with compose v2
answers, and always against the Compose Specification schema the project keeps in
`tests/compose/` (source, digest and licence in its README): never skipped."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from mvsink.cli import build_parser
from mvsink.io.config import FIELDS, REPO_ROOT
from mvsink.stack.jars import CENTRAL
from mvsink.stack.kafka import KAFKA_VERSION
from mvsink.stack.minio import MINIO_VERSION
from mvsink.stack.registry import APICURIO_VERSION
from mvsink.stack.registry import SETTINGS as REGISTRY_SETTINGS
from mvsink.stack.registry import SHA256 as REGISTRY_SHA256
from mvsink.stack.state import CCOMPAT_PATH
from mvsink.tools.compose.verify import TARGETS

SCALED = ("mint", "write", "append")
#: The Spark standalone cluster: the master, and the workers (scaled).
SPARK = ("spark-master", "spark-worker")
#: Prometheus's configuration, rules and image (`docker/prometheus`).
PROMETHEUS = REPO_ROOT / "docker" / "prometheus"
#: Each Spark daemon the compose file runs with `spark-class`: its options that take a value
#: (Spark's `MasterArguments` / `WorkerArguments`), and whether it takes master URLs.
SPARK_DAEMONS = {
    "org.apache.spark.deploy.master.Master": (
        {"--host", "-h", "--port", "-p", "--webui-port", "--properties-file"},
        False,
    ),
    "org.apache.spark.deploy.worker.Worker": (
        {
            "--host",
            "-h",
            "--port",
            "-p",
            "--cores",
            "-c",
            "--memory",
            "-m",
            "--work-dir",
            "-d",
            "--webui-port",
            "--properties-file",
        },
        True,
    ),
}
#: `${NAME:-default}`: a variable the compose file interpolates, with its default.
VARIABLE = re.compile(r"^\$\{(?P<name>\w+):-(?P<default>[^}]*)\}$")


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
        result = subprocess.run(
            [*command, "-f", str(REPO_ROOT / "docker-compose.yaml"), "config", "-q"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert result.returncode == 0, result.stderr


def test_the_schema_copy_is_the_recorded_one() -> None:
    assert hashlib.sha256(SPEC.read_bytes()).hexdigest() == SPEC_SHA256
    assert SPEC_SHA256 in (SPEC.parent / "README.md").read_text()


def test_compose_has_every_component(compose: dict[str, Any]) -> None:
    assert {"kafka", "minio", *SCALED, *SPARK, "prometheus"} <= set(compose["services"])
    for name in ("kafka", "minio", *SCALED, *SPARK, "prometheus"):
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


def _spark_home() -> Path:
    """The Spark inside the installed PySpark (the image installs the same pinned version)."""
    import pyspark

    return Path(pyspark.__file__).parent


def _spark_has_class(name: str) -> bool:
    """Whether one of PySpark's jars holds class `name`."""
    entry = name.replace(".", "/") + ".class"
    for jar in sorted((_spark_home() / "jars").glob("spark-core_*.jar")):
        with zipfile.ZipFile(jar) as archive:
            if entry in archive.namelist():
                return True
    return False


def _check_spark_daemon(command: list[str]) -> None:
    """`spark-class <daemon> ARGS`: PySpark's launcher, a daemon class its jars hold, options
    that daemon takes (a `${VAR:-default}` value checked by its default), master URLs."""
    text = " ".join(command)
    assert (_spark_home() / "bin" / "spark-class").exists(), "PySpark has no bin/spark-class"
    assert command[1] in SPARK_DAEMONS, f"`{text}`: not a Spark daemon the file may run"
    assert _spark_has_class(command[1]), f"`{text}`: no such class in PySpark's jars"
    options, takes_masters = SPARK_DAEMONS[command[1]]
    args, masters = command[2:], []
    while args:
        arg = args.pop(0)
        if arg.startswith("-"):
            assert arg in options and args, f"`{text}`: {arg} is not an option with a value"
            value = args.pop(0)
            variable = VARIABLE.match(value)
            value = variable["default"] if variable else value
            assert value and "$" not in value, f"`{text}`: {arg} {value!r}"
            if arg in ("--port", "-p", "--webui-port", "--cores", "-c"):
                assert value.isdigit(), f"`{text}`: {arg} {value!r} is not a number"
            if arg in ("--memory", "-m"):
                assert re.fullmatch(r"\d+[mMgG]", value), f"`{text}`: {arg} {value!r}"
        else:
            masters.append(arg)
    if takes_masters:
        assert masters and all(m.startswith("spark://") for m in masters), text
    else:
        assert not masters, f"`{text}`: unexpected {masters}"


def _check_entry_point(command: list[str]) -> None:
    if command[:2] == ["python", "-m"]:
        assert _runnable(command[2]), f"`{' '.join(command)}`: nothing to run"
    elif command[0] == "mvsink":
        build_parser().parse_args(command[1:])  # SystemExit on an unknown subcommand
    elif command[0] == "spark-class":
        _check_spark_daemon(command)
    else:
        raise AssertionError(f"`{' '.join(command)}` is not an mvsink entry point")


def test_every_service_command_is_a_real_entry_point(compose: dict[str, Any]) -> None:
    ours = {
        n: s for n, s in compose["services"].items() if s["build"]["dockerfile"] == "Dockerfile"
    }
    assert {*SCALED, *SPARK} <= set(ours)
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
    master, worker = SPARK_DAEMONS
    for wrong in (
        ["spark-class", "org.apache.spark.deploy.master.NoSuchMaster"],
        ["spark-class", master, "--no-such-option", "1"],
        ["spark-class", master, "--port"],  # an option without its value
        ["spark-class", master, "--port", "${PORT:-x}"],
        ["spark-class", worker, "--memory", "2 gigabytes", "spark://m:7077"],
        ["spark-class", worker, "--cores", "1"],  # no master URL
    ):
        with pytest.raises(AssertionError):
            _check_entry_point(wrong)


def test_scaled_services_have_no_fixed_names_or_host_ports(compose: dict[str, Any]) -> None:
    for name in (*SCALED, "spark-worker"):
        service = compose["services"][name]
        assert "container_name" not in service, name
        assert "ports" not in service, name


def test_service_settings_are_known_to_the_config(compose: dict[str, Any]) -> None:
    """`mvsink.io.config`'s settings, or one `mvsink.io.spark` reads from the environment itself."""
    spark = (REPO_ROOT / "mvsink" / "io" / "spark.py").read_text()
    known = {f.env for f in FIELDS} | set(re.findall(r"\"(MVSINK_\w+)\"", spark))
    for name in ("provision", *SCALED):
        env = compose["services"][name]["environment"]
        unknown = {k for k in env if k.startswith("MVSINK_")} - known
        assert not unknown, f"{name}: settings mvsink.io.config does not read: {unknown}"


def test_the_schema_check_rejects_an_invalid_compose_file() -> None:
    schema = json.loads(SPEC.read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate({"services": {"mint": {"comand": ["x"]}}})


def test_service_healthchecks_ask_readiness_on_the_metrics_port(compose: dict[str, Any]) -> None:
    for name in SCALED:
        service = compose["services"][name]
        port = service["environment"]["MVSINK_METRICS_PORT"]
        assert service["healthcheck"]["test"] == ["CMD", "http-ready", str(port), "/readyz"], name
    runtime = " ".join(_stages("Dockerfile")[-1])
    assert "COPY docker/http-ready /usr/local/bin/http-ready" in runtime


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


@pytest.mark.parametrize(
    "dockerfile",
    [
        "Dockerfile",
        "docker/kafka/Dockerfile",
        "docker/minio/Dockerfile",
        "docker/prometheus/Dockerfile",
    ],
)
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


def test_only_kafka_minio_the_spark_ui_the_registry_and_prometheus_publish_ports_on_loopback(
    compose: dict[str, Any],
) -> None:
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert name in ("kafka", "minio", "spark-master", "registry", "prometheus"), name
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
    # The PLAINTEXT listener the services use; the check starts no JVM.
    listeners = services["kafka"]["environment"]["KAFKA_LISTENERS"]
    assert "PLAINTEXT://:9092" in listeners.split(",")
    assert services["kafka"]["healthcheck"]["test"] == ["CMD", "kafka-ready", "9092"]
    kafka_image = (REPO_ROOT / "docker" / "kafka" / "Dockerfile").read_text()
    assert re.search(r"COPY .*docker/kafka/kafka-ready .*/opt/kafka/bin/", kafka_image)
    assert services["minio"]["healthcheck"]["test"] == [
        "CMD",
        "http-ready",
        "9000",
        "/minio/health/ready",
    ]
    assert services["registry"]["healthcheck"]["test"] == [
        "CMD",
        "http-ready",
        "8080",
        f"{CCOMPAT_PATH}/subjects",
    ]
    assert services["prometheus"]["healthcheck"]["test"] == [
        "CMD",
        "http-ready",
        "9090",
        "/-/ready",
    ]
    for image in ("minio", "registry", "prometheus"):
        dockerfile = (REPO_ROOT / "docker" / image / "Dockerfile").read_text()
        assert "COPY docker/http-ready /usr/local/bin/http-ready" in dockerfile, image


def _spark_command(compose: dict[str, Any], service: str) -> dict[str, str]:
    """The options of a Spark daemon's command, and its master URL as `master`."""
    command = compose["services"][service]["command"][2:]
    options = {}
    while command:
        arg = command.pop(0)
        if arg.startswith("-"):
            options[arg] = command.pop(0)
        else:
            options["master"] = arg
    return options


def test_the_write_drivers_run_on_the_spark_cluster(compose: dict[str, Any]) -> None:
    """write is a driver of spark-master's cluster, started after the master and the workers are
    ready, reachable by the executors; the workers register with that master; the other services
    keep Spark in their container (`local[*]`)."""
    services = compose["services"]
    master = _spark_command(compose, "spark-master")
    url = f"spark://{master['--host']}:{master['--port']}"
    assert master["--host"] == "spark-master"
    write = services["write"]
    assert write["environment"]["MVSINK_SPARK_MASTER"] == url
    assert write["environment"]["MVSINK_SPARK_DRIVER_HOST"] == "auto"
    for needed in SPARK:
        assert write["depends_on"][needed]["condition"] == "service_healthy", needed
    assert write["depends_on"]["provision"]["condition"] == "service_completed_successfully"
    assert _spark_command(compose, "spark-worker")["master"] == url
    assert services["spark-worker"]["depends_on"]["spark-master"]["condition"] == "service_healthy"
    for name in ("mint", "append", "view", "provision"):
        assert "MVSINK_SPARK_MASTER" not in services[name]["environment"], name
    # the write environment is the shared one plus the cluster's two settings
    shared = services["mint"]["environment"]
    assert {k: v for k, v in write["environment"].items() if k in shared} == shared


def test_the_spark_daemons_run_in_the_foreground_without_rest_submission(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    opts = services["spark-master"]["environment"]["SPARK_MASTER_OPTS"].split()
    assert "-Dspark.master.rest.enabled=false" in opts
    cores = [o for o in opts if o.startswith("-Dspark.deploy.defaultCores=")]
    assert len(cores) == 1 and VARIABLE.match(cores[0].split("=", 1)[1]), cores
    for name in SPARK:
        assert services[name]["init"] is True, name  # reaps executors and Python workers
        assert services[name]["command"][0] == "spark-class", name  # not start-*.sh (daemonizes)
    master_ui = _spark_command(compose, "spark-master")["--webui-port"]
    checks = {name: services[name]["healthcheck"]["test"] for name in SPARK}
    assert checks["spark-master"][:4] == ["CMD", "http-ready", master_ui, "/json/"]
    assert checks["spark-worker"][:4] == ["CMD", "http-ready", "8081", "/json/"]  # its default UI
    (published,) = services["spark-master"]["ports"]
    assert published.startswith("127.0.0.1:${") and published.endswith(f":{master_ui}")


def test_spark_home_is_the_installed_pyspark() -> None:
    """The runtime image's SPARK_HOME is the pyspark package of its virtualenv, whose `bin` the
    PATH holds (`spark-class`), for the Python version of the Debian base."""
    runtime = _stages("Dockerfile")[-1]
    env = " ".join(line for line in runtime if line.startswith("ENV "))
    home = re.search(r"SPARK_HOME=(\S+)", env)
    assert home is not None, "the runtime stage sets SPARK_HOME"
    assert "PATH=/opt/mvsink/venv/bin:" in env
    assert home[1] == "/opt/mvsink/venv/lib/python3.11/site-packages/pyspark"  # bookworm: 3.11
    local = _spark_home()
    assert local.parent.name == "site-packages" and (local / "bin" / "spark-class").exists()


def test_prometheus_scrapes_every_service_that_serves_metrics(compose: dict[str, Any]) -> None:
    """Each compose service running an mvsink service (`python -m services.*`, serving /metrics
    on every interface at MVSINK_METRICS_PORT) is a job of `docker/prometheus/prometheus.yml`,
    its replicas found by the service's name through Docker's DNS on that port; Prometheus's own
    job is the only other one, and `mvsink compose verify` expects exactly these jobs."""
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    served = {
        name: service
        for name, service in compose["services"].items()
        if service.get("command", [])[:2] == ["python", "-m"]
    }
    assert set(SCALED) <= set(served)
    assert set(jobs) == {*served, "prometheus"} == set(TARGETS)
    for name, service in served.items():
        (found,) = jobs[name]["dns_sd_configs"]
        env = service["environment"]
        assert found["names"] == [name] and found["type"] == "A", name
        assert found["port"] == int(env["MVSINK_METRICS_PORT"]), name
        assert env["MVSINK_METRICS_ADDR"] == "0.0.0.0", name


def test_prometheus_runs_the_version_its_image_names_on_loopback(compose: dict[str, Any]) -> None:
    """Debian's package at the version of the image's tag (the build checks it), its UI and API
    published on loopback at the port it listens on, its data in a volume, ready when /-/ready
    answers."""
    service = compose["services"]["prometheus"]
    dockerfile = (PROMETHEUS / "Dockerfile").read_text()
    version = re.search(r"^ARG PROMETHEUS_VERSION=(\S+)$", dockerfile, re.MULTILINE)
    assert version and service["image"] == f"mvsink-prometheus:{version[1]}"
    assert "apt-get install -y --no-install-recommends prometheus " in dockerfile
    (published,) = service["ports"]
    assert published.startswith("127.0.0.1:${MVSINK_PROMETHEUS_HOST_PORT:-")
    assert published.endswith(":9090") and '"--web.listen-address=:9090"' in dockerfile
    assert service["volumes"] == ["prometheus-data:/var/lib/prometheus"]


def test_the_registry_runs_the_embedded_stacks_apicurio_with_its_settings(
    compose: dict[str, Any],
) -> None:
    """The image fetches the distribution the embedded stack fetches (its version, the version of
    the tag, and its SHA-256), runs it
    with the stack's settings, keeps its storage in a volume, and every mvsink process of the
    file frames its records for it (the URL the registry serves, on the compose network)."""
    service = compose["services"]["registry"]
    dockerfile = (REPO_ROOT / "docker" / "registry" / "Dockerfile").read_text()
    assert service["image"] == f"mvsink-registry:{APICURIO_VERSION}"
    assert f"ARG APICURIO_VERSION={APICURIO_VERSION}" in dockerfile
    assert f"ARG APICURIO_SHA256={REGISTRY_SHA256}" in dockerfile
    assert "sha256sum -c" in dockerfile and f"{CENTRAL}/io/apicurio/" in dockerfile
    for key, value in REGISTRY_SETTINGS.items():
        assert f'"-D{key}={value}"' in dockerfile, key
    assert '"-Dquarkus.http.port=8080"' in dockerfile
    assert "jdbc:h2:file:/var/lib/registry/" in dockerfile
    assert service["volumes"] == ["registry-data:/var/lib/registry"]
    (published,) = service["ports"]
    assert published.startswith("127.0.0.1:") and published.endswith(":8080")
    env = compose["services"]["mint"]["environment"]
    assert env["MVSINK_SCHEMA_REGISTRY_URL"] == (
        f"${{MVSINK_SCHEMA_REGISTRY_URL-http://registry:8080{CCOMPAT_PATH}}}"
    )
    assert compose["services"]["provision"]["depends_on"]["registry"] == {
        "condition": "service_healthy"
    }
