"""`mvsink compose verify`: the compose deployment, end to end, on this machine.

Phases, each timed and printed:

1. **engine**: a Docker engine and the compose v2 plugin, provided where missing
   (`mvsink.tools.compose.engine`);
2. **base**: `debian:bookworm-slim`, pulled or made with debootstrap;
3. **build**: `docker compose build` of every image (cached layers make a rebuild quick);
4. **up**: `docker compose up -d --scale write=2 --scale append=2 --scale spark-worker=2` as a
   project of its own (`mvsink-verify-<id>`, fresh volumes, Kafka, MinIO, the Spark master's
   web UI and Prometheus published on free loopback ports; each Spark worker offers 2 cores and
   each application gets 2, so every write driver has an executor on each worker);
5. **converge**: checked from outside the containers, as a user would: the shard read through
   MinIO's published port equals the view job's output -- the desired topic read through
   Kafka's published listener -- at the shard's upper, with no row whose diff is not 1;
6. **scaled**: the logs show both write containers holding desired partitions and staging, and
   both append containers holding an append worker and appending;
   **spark cluster**: the master's web UI (`/json/`, through its published port) lists both
   workers ALIVE and one running `mvsink-write-*` application per write container, and each
   worker's own UI (read inside its container) lists executors of every one of them;
   **prometheus**: through Prometheus's HTTP API on its published port, every replica of every
   service is a target and up (`/api/v1/targets`: mint 1, write 2, append 2, ct 2, and
   Prometheus itself), every rule of `docker/prometheus/rules.yml` evaluates without error
   (`/api/v1/rules`), and the sink's lag and freshness are recorded (`/api/v1/query`); then
   every append container is killed -- the sink has no append -- and `MvsinkSinkStuck` for the
   sink must turn pending, then firing (`/api/v1/alerts`); the containers are started again,
   the alert must resolve, the shard converge and the targets be up again;
   **schema registry**: through the registry's published port, every subject of the sink's
   topics is registered (`mvsink.io.registry.topic_kinds`) with the level provisioning sets,
   and the last record of partition 0 of `desired`, `descs`, `batches` and `frontiers` is in
   its wire format (magic byte 0) with a schema id the registry resolves to that topic's record
   (the host-side reads of every phase go through the registry as well);
7. **kill**: `docker kill` of one write and one append container; the shard converges and the
   survivors' logs show work since the kill (they took over the partitions and the worker);
   the killed two are started again (`docker kill` is a manual stop: the restart policy leaves
   them down), the shard converges and their logs show work since their start;
8. **kill spark-worker**: `docker kill` of one Spark worker (its executors die with it); the
   shard converges and both write containers' logs show work since the kill, done on the
   surviving worker's executors, which the master then lists alone; the worker is started
   again, the master lists both ALIVE with executors of every write application on each, and
   the shard converges;
9. **restart kafka**, **restart minio**, **restart registry**: `docker compose restart` of each;
   converge again (the registry keeps its schemas and ids in its volume);
10. **continual task**: the two `ct` replicas' output (`examples/ct/milestones.toml` over the
    view's shard) reaches the shard's upper and holds, as of its upper, exactly the customers
    whose total in the shard is at least 1,000.00 there, each once; no time was logged written
    by both replicas;
11. **down**: `docker compose down -v` (always, unless `--keep`).

"Converge" after a fault means: the shard's upper moved at least `ADVANCE` times past where it
was when the fault was over, and equals the view there. A phase that fails prints the
containers' states and log tails (the sink's own services last), writes every container's whole
log to `.mvsink/compose/logs/<project>.log`, and the command exits non-zero.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mvsink import Say
from mvsink.core.errors import MvsinkError
from mvsink.core.rows import parse_row_schema
from mvsink.core.updates import DIFF
from mvsink.io import registry
from mvsink.io.config import Config
from mvsink.io.kafka import last_message
from mvsink.shard import Shard, open_shard
from mvsink.stack.procs import free_ports
from mvsink.stack.state import stack_config
from mvsink.tools.compose import engine
from mvsink.upstream.desired import read_desired

#: Times the upper must move past a fault before the shard counts as converged again.
ADVANCE = 3
#: The demo view's row schema (the compose file's default `MVSINK_ROW_SCHEMA`).
ROW_SCHEMA = "customer string not null, orders long, total double"
LOG_LINE = re.compile(r"^(?P<container>\S+)\s+\| (?P<text>.*)$")
#: A logged list of partitions or workers: `[0, 2]`.
HELD = re.compile(r"\[([\d, ]*)\]")
#: What each scaled service logs when it holds something, and for each piece of work it did.
WRITE_HOLDS, WRITE_WORK = "desired partitions assigned: ", re.compile(r"\bstaged .*: partitions \[")
APPEND_HOLDS, APPEND_WORK = "append workers assigned: ", re.compile(r"\bappended \d+ parts for ")
#: What write logs when it launches its resident tasks, and when a round falls back to a job.
RESIDENTS, HANDED_BACK = " residents on ", "run as a one-shot job"
#: Per scaled service: its holds marker, its work pattern, and what its work is called.
WORK = {
    "write": (WRITE_HOLDS, WRITE_WORK, "batches staged"),
    "append": (APPEND_HOLDS, APPEND_WORK, "appends"),
}
#: What a failed phase prints of each service, and how many lines of each container: the
#: sink's services last, where a CI log's tail shows them.
DIAGNOSE = (
    ("provision", 3),
    ("registry", 5),
    ("prometheus", 5),
    ("minio", 5),
    ("kafka", 8),
    ("spark-master", 5),
    ("spark-worker", 8),
    ("view", 8),
    ("ct", 5),
    ("mint", 10),
    ("append", 10),
    ("write", 14),
)
#: Log lines a diagnosis leaves out: Spark's and Kafka's lines at every task and transaction.
NOISE = re.compile(
    r"TaskSetManager|ExecutorRunner: Launch command|SecurityManager|"
    r"TransactionCoordinator|clientserver|^\s*at |ProducerStateManager"
)
#: A diagnosed log line is cut at this many characters.
LINE_MAX = 240
#: Replicas of the scaled services, `docker compose up --scale` each.
SCALE = {"write": 2, "append": 2, "spark-worker": 2, "ct": 2}
#: Cores each Spark worker offers and each application (a write driver) gets, in this project:
#: as many as there are workers, so the master spreads each application over all of them.
SPARK_CORES = SCALE["spark-worker"]
#: The names the write drivers give their Spark applications: `mvsink-write-<sink id>`.
WRITE_APP = "mvsink-write-"
#: Read inside a worker container: its own web UI's JSON (id, executors and their applications).
WORKER_STATE = (
    "import urllib.request as u; "
    "print(u.urlopen('http://127.0.0.1:8081/json/', timeout=5).read().decode())"
)
#: The jobs Prometheus scrapes (`docker/prometheus/prometheus.yml`) and how many targets each
#: has in this project: one per replica, and Prometheus itself.
TARGETS = {
    "prometheus": 1,
    "mint": 1,
    "write": SCALE["write"],
    "append": SCALE["append"],
    "ct": SCALE["ct"],
}
#: The alert of a sink that stopped moving (`docker/prometheus/rules.yml`).
STUCK_ALERT = "MvsinkSinkStuck"
#: The per-sink recording rules the prometheus phase reads: what each is, its series, its unit.
SINK_SERIES = (
    ("lag", "sink:mvsink_lag_times:max", " times"),
    ("freshness", "sink:mvsink_freshness_seconds:estimate", "s"),
    ("stalled", "sink:mvsink_stalled_seconds:max", "s"),
)


class VerifyError(MvsinkError):
    """A phase of the compose verification failed."""


@dataclass
class Phases:
    """Times each phase and prints one line per phase."""

    say: Say
    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.say(f"[compose] {name} ...")
        started = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = time.monotonic() - started
        self.say(f"[compose] {name}: done in {self.seconds[name]:.1f}s")

    def table(self) -> str:
        width = max(len(n) for n in self.seconds)
        rows = [f"  {name:<{width}}  {secs:8.1f}s" for name, secs in self.seconds.items()]
        return "\n".join(
            ["phase times:", *rows, f"  {'total':<{width}}  {sum(self.seconds.values()):8.1f}s"]
        )


@dataclass
class Deployment:
    """One compose project of this verification, seen from this machine."""

    project: str
    env: dict[str, str]
    config: Config
    say: Say
    #: The Spark master's web UI port on 127.0.0.1.
    spark_ui_port: int = 0
    #: Prometheus's port (UI and HTTP API) on 127.0.0.1.
    prometheus_port: int = 0

    def compose(self, *args: str, timeout: float = 600.0) -> str:
        return engine.compose(args, project=self.project, env=self.env, timeout=timeout).stdout

    def prometheus(self, path: str, **params: str) -> Any:
        """The `data` of Prometheus's answer to `GET /api/v1/<path>?<params>`, through its
        published port; `VerifyError` unless the answer is a success."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        url = f"http://127.0.0.1:{self.prometheus_port}/api/v1/{path}{query}"
        with urllib.request.urlopen(url, timeout=5) as response:
            answer = json.load(response)
        if answer.get("status") != "success":
            raise VerifyError(f"Prometheus's answer to {path}: {answer}")
        return answer["data"]

    def containers(self, service: str) -> list[str]:
        """Names of the service's containers, in replica order."""
        out = self.compose("ps", "-a", "--format", "{{.Name}}", service)
        return sorted(out.split(), key=lambda n: int(n.rsplit("-", 1)[-1]))

    def logs(self, service: str) -> dict[str, list[str]]:
        """Each container's log lines."""
        lines: dict[str, list[str]] = {}
        for line in self.compose("logs", "--no-color", service, timeout=120).splitlines():
            match = LOG_LINE.match(line)
            if match:
                lines.setdefault(match["container"], []).append(match["text"])
        return lines

    def diagnose(self, home: Path) -> None:
        """Print what the containers are doing, the sink's own services last (a CI log shows
        its tail): states, then a few log lines of each container, without the lines Spark and
        Kafka log at every task and transaction; the whole logs go to a file under `home`."""
        result = engine.compose(["ps", "-a"], project=self.project, env=self.env, check=False)
        self.say(result.stdout)
        logs = engine.compose(
            ["logs", "--no-color", "--timestamps"],
            project=self.project,
            env=self.env,
            check=False,
            timeout=120,
        )
        path = home / "logs" / f"{self.project}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(logs.stdout + logs.stderr)
        self.say(f"--- every container's whole log: {path}")
        for service, count in DIAGNOSE:
            self.say(f"--- {service} (last lines) ---")
            for container, text in last_lines(self.logs(service), count).items():
                self.say("\n".join(f"{container} | {line[:LINE_MAX]}" for line in text))


def last_lines(logs: dict[str, list[str]], count: int) -> dict[str, list[str]]:
    """The last `count` lines of each container's `logs` (`Deployment.logs`), but for blank
    ones and those logged at every Spark task and Kafka transaction."""
    kept = {
        container: [line for line in lines if line.strip() and not NOISE.search(line)]
        for container, lines in sorted(logs.items())
    }
    return {container: lines[-count:] for container, lines in kept.items() if lines}


def _compose_only(name: str) -> bool:
    """Whether `name` is a setting of the compose file (ports, Spark cores), not of mvsink."""
    return "HOST_PORT" in name or name.startswith("MVSINK_SPARK_")


def _deployment(say: Say) -> Deployment:
    project = f"mvsink-verify-{uuid.uuid4().hex[:6]}"
    kafka_port, minio_port, spark_ui_port, prometheus_port, registry_port = free_ports(5)
    env = {
        **engine.build_env(),
        "MVSINK_S3_ACCESS_KEY": f"verify{secrets.token_hex(4)}",
        "MVSINK_S3_SECRET_KEY": secrets.token_hex(16),
        "MVSINK_KAFKA_HOST_PORT": str(kafka_port),
        "MVSINK_MINIO_HOST_PORT": str(minio_port),
        "MVSINK_SPARK_UI_HOST_PORT": str(spark_ui_port),
        "MVSINK_PROMETHEUS_HOST_PORT": str(prometheus_port),
        "MVSINK_REGISTRY_HOST_PORT": str(registry_port),
        "MVSINK_SPARK_WORKER_CORES": str(SPARK_CORES),
        "MVSINK_SPARK_APP_CORES": str(SPARK_CORES),
        "MVSINK_SINK_ID": "verify",
        "MVSINK_SHARD_ID": "verify",
        "MVSINK_PARTITIONS": "4",
        "MVSINK_APPEND_WORKERS": "2",
        "MVSINK_ROW_SCHEMA": ROW_SCHEMA,
        "MVSINK_S3_BUCKET": "mvsink",
        # The check reads all of desired from offset 0 to know the view independently of the
        # sink (`read_desired`), so the write service keeps the topic whole here.
        "MVSINK_DESIRED_TRIM_INTERVAL": "0",
    }
    host = {
        **{k: v for k, v in env.items() if k.startswith("MVSINK_") and not _compose_only(k)},
        "MVSINK_KAFKA_BOOTSTRAP": f"127.0.0.1:{kafka_port}",
        "MVSINK_S3_ENDPOINT": f"127.0.0.1:{minio_port}",
        "MVSINK_S3_SECURE": "false",
        "MVSINK_SCHEMA_REGISTRY_URL": f"http://127.0.0.1:{registry_port}/apis/ccompat/v7",
    }
    host.pop("MVSINK_BUILD_CA", None)
    return Deployment(
        project, env, stack_config(None, env=host), say, spark_ui_port, prometheus_port
    )


def _rows(table: Any, names: list[str]) -> dict[tuple[Any, ...], int]:
    got: dict[tuple[Any, ...], int] = {}
    for row in table.to_pylist():
        key = tuple(row[n] for n in names)
        got[key] = got.get(key, 0) + int(row[DIFF])
    return got


def check_once(shard: Shard, config: Config) -> tuple[int, bool, int]:
    """The shard's upper, whether the shard equals the view job's output there (an empty view
    never counts: the view job publishes rows from its first tick), and the number of rows of
    the shard whose diff is not 1 (a duplicate or a retraction with no row)."""
    upper = shard.upper().time or 0
    schema = parse_row_schema(config.row_schema)
    names = list(schema.names)
    got = _rows(shard.snapshot(upper), names)
    want = _rows(
        read_desired(
            config.kafka_bootstrap,
            config.topics.desired,
            config.partitions,
            schema,
            upper,
            framing=config.framing(),
        ),
        names,
    )
    return upper, bool(want) and got == want, sum(1 for d in got.values() if d != 1)


def wait_converged(deployment: Deployment, shard: Shard, advance: int, timeout: float) -> int:
    """Read the shard's upper now, then wait until it moved at least `advance` times past it and
    the shard equals the view there; that upper. Errors of a read (a service still away) are
    retried until `timeout`."""
    say, deadline, last, said = deployment.say, time.monotonic() + timeout, "", 0.0
    base: int | None = None
    while True:
        try:
            if base is None:
                base = shard.upper().time or 0
            upper, equal, odd = check_once(shard, deployment.config)
            status = f"upper {upper}, equal to the view: {equal}, rows with diff != 1: {odd}"
            if upper >= base + advance and equal and odd == 0:
                say(f"  converged: {status}")
                return upper
        except Exception as error:  # Kafka or MinIO restarting: the next round asks again
            status = f"not readable yet ({type(error).__name__}: {str(error)[:120]})"
        if time.monotonic() > deadline:
            raise VerifyError(f"no convergence in {timeout:.0f}s ({advance} past {base}): {status}")
        if status != last or time.monotonic() - said > 15:
            say(f"  waiting for upper >= {'?' if base is None else base + advance}: {status}")
            last, said = status, time.monotonic()
        time.sleep(1.0)


#: The continual task the compose file runs, and its threshold (`examples/ct/milestones.toml`).
CT_OUTPUT, CT_THRESHOLD = "ct-milestones", 1000.0
CT_WROTE = re.compile(r" wrote time (\d+): ")


def check_ct(deployment: Deployment, shard: Shard, upper: int, timeout: float) -> dict[str, Any]:
    """Wait until the continual task's output reaches `upper`; then, as of the output's upper,
    it holds each customer whose total in the view's shard reached the threshold, once, and
    nobody else; and no time was written by both replicas. Its figures."""
    deadline, status = time.monotonic() + timeout, "not created yet"
    while True:
        try:
            output = open_shard(CT_OUTPUT, None, deployment.config.s3)
            at = output.upper().time or 0
            status = f"output upper {at}"
            if at >= upper:
                break
        except MvsinkError:
            pass
        if time.monotonic() > deadline:
            raise VerifyError(
                f"the continual task did not reach {upper} in {timeout:.0f}s: {status}"
            )
        time.sleep(1.0)
    rows = _rows(output.snapshot(at), ["customer", "total", "tick"])
    view = _rows(shard.snapshot(at), ["customer", "total"])
    want = {customer for (customer, total), n in view.items() if n == 1 and total >= CT_THRESHOLD}
    got = [customer for (customer, total, _), n in rows.items() for _ in range(n)]
    if sorted(got) != sorted(want) or any(t < CT_THRESHOLD for _, t, _ in rows):
        raise VerifyError(
            f"the continual task's output at {at} is not the customers at or over "
            f"{CT_THRESHOLD}: got {sorted(got)}, want {sorted(want)}"
        )
    written: dict[int, list[str]] = {}
    for container, lines in deployment.logs("ct").items():
        for line in lines:
            if (match := CT_WROTE.search(line)) is not None:
                written.setdefault(int(match[1]), []).append(container)
    twice = {t: c for t, c in written.items() if len(c) > 1}
    if twice:
        raise VerifyError(f"times written by more than one replica: {twice}")
    writers = sorted({c for cs in written.values() for c in cs})
    deployment.say(
        f"  continual task at {at}: {len(got)} customers at or over {CT_THRESHOLD:.0f}, "
        f"{len(written)} times written, by {writers}"
    )
    return {"upper": at, "customers": len(got), "times_written": len(written), "writers": writers}


def check_scaled(deployment: Deployment, timeout: float = 120.0) -> dict[str, Any]:
    """Both write containers hold desired partitions and staged; both append containers hold
    an append worker and appended. Their figures."""
    deadline = time.monotonic() + timeout
    while True:
        figures = {
            service: _work(deployment.logs(service), holds, work)
            for service, (holds, work, _) in WORK.items()
        }
        busy = {s: [c for c, f in figures[s].items() if f["holds"] and f["done"]] for s in figures}
        if all(len(b) >= 2 for b in busy.values()):
            for service, containers in figures.items():
                for name, f in containers.items():
                    line = f"  {name}: holds {f['holds']}, {f['done']} {WORK[service][2]}"
                    if service == "write":
                        line += (
                            f", {f['crews']} resident crews launched, {f['handed_back']} "
                            "rounds handed back to a Spark job"
                        )
                    deployment.say(line)
            return figures
        if time.monotonic() > deadline:
            raise VerifyError(
                f"the scaled services do not all work after {timeout:.0f}s: {figures}"
            )
        time.sleep(2.0)


def _work(
    logs: dict[str, list[str]], holds: str, done: re.Pattern[str]
) -> dict[str, dict[str, Any]]:
    """Per container: what it holds now (its last assignment line) and its lines of work."""
    figures: dict[str, dict[str, Any]] = {}
    for container, lines in logs.items():
        held = [HELD.match(line.split(holds, 1)[1]) for line in lines if holds in line]
        last = held[-1] if held else None
        figures[container] = {
            "holds": [int(n) for n in last[1].replace(",", " ").split()] if last else [],
            "done": sum(1 for line in lines if done.search(line)),
            # write: crews of resident tasks launched, and rounds they handed back to a job
            "crews": sum(1 for line in lines if RESIDENTS in line),
            "handed_back": sum(1 for line in lines if HANDED_BACK in line),
        }
    return figures


def check_work_since(
    deployment: Deployment, since: str, containers: dict[str, str], timeout: float
) -> None:
    """Each of `containers` (name -> its service) did work after `since` (RFC 3339), within
    `timeout` (a liveness bound, as a convergence's): a write container staged, an append
    container appended. A write container started again works only once its Spark application
    has executors again, which on a loaded box can take minutes."""
    deadline, pending = time.monotonic() + timeout, dict(containers)
    while pending:
        for name, service in list(pending.items()):
            logs = engine.docker("logs", "--since", since, name)
            holds, work, called = WORK[service]
            figures = _work({name: (logs.stdout + logs.stderr).splitlines()}, holds, work)[name]
            if figures["done"]:
                deployment.say(f"  {name} worked since {since}: {figures['done']} {called}")
                del pending[name]
        if pending and time.monotonic() > deadline:
            raise VerifyError(f"no work since {since} in {timeout:.0f}s from {sorted(pending)}")
        if pending:
            time.sleep(2.0)


def spark_state(deployment: Deployment) -> dict[str, Any]:
    """The Spark cluster as its UIs show it: the ALIVE workers (id -> the container whose UI
    names that id, and the applications it runs executors of) and the running write
    applications (id -> cores granted)."""
    url = f"http://127.0.0.1:{deployment.spark_ui_port}/json/"
    with urllib.request.urlopen(url, timeout=5) as response:
        master = json.load(response)
    alive = {w["id"] for w in master.get("workers", []) if w.get("state") == "ALIVE"}
    apps = {
        a["id"]: int(a.get("cores", 0))
        for a in master.get("activeapps", [])
        if str(a.get("name", "")).startswith(WRITE_APP) and a.get("state") == "RUNNING"
    }
    workers: dict[str, dict[str, Any]] = {}
    for container in deployment.containers("spark-worker"):
        if not _running(container):
            continue
        shown = engine.docker("exec", container, "python", "-c", WORKER_STATE, timeout=30)
        if shown.returncode != 0:
            continue  # its UI not up yet
        worker = json.loads(shown.stdout)
        if worker.get("id") in alive:
            runs = sorted({str(e.get("appid")) for e in worker.get("executors", [])})
            workers[worker["id"]] = {"container": container, "apps": runs}
    return {"alive": sorted(alive), "workers": workers, "apps": apps}


def spread(state: dict[str, Any], workers: int, writers: int) -> bool:
    """Whether `state` (`spark_state`) is `workers` ALIVE workers, each one seen in its
    container, and `writers` running write applications, each with executors on every worker."""
    apps, found = set(state["apps"]), state["workers"]
    return (
        len(state["alive"]) == workers == len(found)
        and len(apps) == writers
        and all(apps <= set(w["apps"]) for w in found.values())
    )


def check_spark(deployment: Deployment, workers: int, timeout: float = 180.0) -> dict[str, Any]:
    """The master lists `workers` ALIVE workers, each one a running spark-worker container, and
    one running write application per running write container; every worker runs executors of
    every write application. The state (`spark_state`)."""
    deadline = time.monotonic() + timeout
    while True:
        writers = sum(1 for c in deployment.containers("write") if _running(c))
        try:
            state = spark_state(deployment)
        except (OSError, ValueError) as error:  # the master restarting, a UI half up
            state = {"error": f"{type(error).__name__}: {error}"}
        if "error" not in state and spread(state, workers, writers):
            for worker_id, w in sorted(state["workers"].items(), key=lambda i: i[1]["container"]):
                deployment.say(
                    f"  {w['container']} ({worker_id}): executors of "
                    f"{', '.join(a for a in w['apps'] if a in state['apps'])}"
                )
            deployment.say(f"  write applications (cores): {state['apps']}")
            return state
        if time.monotonic() > deadline:
            raise VerifyError(
                f"the Spark cluster is not {workers} ALIVE workers running "
                f"executors of {writers} write applications after {timeout:.0f}s: "
                f"{state}"
            )
        time.sleep(2.0)


def target_health(data: dict[str, Any]) -> dict[str, list[str]]:
    """Per job, the health of each of its active targets (`up`, `down`, `unknown` before the
    first scrape), sorted; from `/api/v1/targets`'s data."""
    jobs: dict[str, list[str]] = {}
    for target in data.get("activeTargets", []):
        job = str(target.get("labels", {}).get("job", ""))
        jobs.setdefault(job, []).append(str(target.get("health", "")))
    return {job: sorted(health) for job, health in sorted(jobs.items())}


def targets_up(health: dict[str, list[str]], want: dict[str, int]) -> bool:
    """Whether each job of `want` has exactly that many targets (`target_health`), all up."""
    return all(health.get(job, []) == ["up"] * count for job, count in want.items())


def describe_targets(health: dict[str, list[str]], want: dict[str, int]) -> str:
    """`job up/wanted up` per job of `want`, and the other states found."""
    parts = []
    for job, count in want.items():
        found = health.get(job, [])
        other = sorted(h for h in found if h != "up")
        parts.append(
            f"{job} {found.count('up')}/{count} up"
            + (f" (also {', '.join(other)})" if other else "")
        )
    return ", ".join(parts)


def rule_problems(data: dict[str, Any]) -> tuple[int, list[str]]:
    """The number of rules Prometheus loaded, and `name: health error` of each that does not
    evaluate cleanly (health `unknown` before its first evaluation, `err` on a failing query);
    from `/api/v1/rules`'s data."""
    rules = [rule for group in data.get("groups", []) for rule in group.get("rules", [])]
    bad = [
        f"{r.get('name')}: {r.get('health')} {r.get('lastError', '')}".rstrip()
        for r in rules
        if r.get("health") != "ok"
    ]
    return len(rules), bad


def _alert_name(alert: dict[str, Any]) -> str:
    labels = alert.get("labels", {})
    shown = ",".join(
        f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("alertname", "severity")
    )
    return f"{labels.get('alertname')}{{{shown}}} {alert.get('state')}"


def alert_state(data: dict[str, Any], name: str, sink: str) -> tuple[str, list[str]]:
    """From `/api/v1/alerts`'s data (the active alerts): the state of alert `name` for `sink`
    (`firing`, `pending`, or `inactive` when it is not active), and every active alert as
    `name{labels} state`."""
    alerts = data.get("alerts", [])
    states = {
        str(a.get("state"))
        for a in alerts
        if a.get("labels", {}).get("alertname") == name and a["labels"].get("sink") == sink
    }
    state = "firing" if "firing" in states else "pending" if "pending" in states else "inactive"
    return state, sorted(_alert_name(a) for a in alerts)


def check_targets(deployment: Deployment, timeout: float = 120.0) -> dict[str, list[str]]:
    """Prometheus scrapes every replica of every service (`TARGETS`), each one up. Each job's
    targets' health (`target_health`)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            health = target_health(deployment.prometheus("targets", state="active"))
            status = describe_targets(health, TARGETS)
        except (OSError, ValueError, VerifyError) as error:  # starting, or restarting
            health, status = {}, f"not answering ({type(error).__name__}: {error})"
        if health and targets_up(health, TARGETS):
            deployment.say(f"  prometheus targets: {status}")
            return health
        if time.monotonic() > deadline:
            raise VerifyError(f"Prometheus's targets are not all up after {timeout:.0f}s: {status}")
        time.sleep(2.0)


def check_rules(deployment: Deployment, timeout: float = 60.0) -> int:
    """Prometheus loaded the rules and each one evaluates without error; how many."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            count, bad = rule_problems(deployment.prometheus("rules"))
        except (OSError, ValueError, VerifyError) as error:
            count, bad = 0, [f"not answering ({type(error).__name__}: {error})"]
        if count and not bad:
            deployment.say(f"  prometheus rules: {count} loaded, every one evaluating (health ok)")
            return count
        if time.monotonic() > deadline:
            raise VerifyError(f"Prometheus's rules after {timeout:.0f}s: {count} loaded; {bad}")
        time.sleep(2.0)


def check_sink_series(deployment: Deployment, timeout: float = 60.0) -> dict[str, float]:
    """Prometheus records the sink's lag, freshness and stall (`SINK_SERIES`); their values."""
    sink, deadline = deployment.config.sink_id, time.monotonic() + timeout
    while True:
        values: dict[str, float] = {}
        for name, series, _ in SINK_SERIES:
            try:
                result = deployment.prometheus("query", query=f'{series}{{sink="{sink}"}}')
            except (OSError, ValueError, VerifyError):
                break
            if result.get("result"):
                values[name] = float(result["result"][0]["value"][1])
        if len(values) == len(SINK_SERIES):
            shown = ", ".join(f"{n} {values[n]:.1f}{unit}" for n, _, unit in SINK_SERIES)
            deployment.say(f"  sink {sink} as Prometheus records it: {shown}")
            return values
        if time.monotonic() > deadline:
            missing = [s for n, s, _ in SINK_SERIES if n not in values]
            raise VerifyError(f"Prometheus records no {missing} for sink {sink} in {timeout:.0f}s")
        time.sleep(2.0)


def wait_alert(
    deployment: Deployment, firing: bool, since: float, after: str, timeout: float
) -> float:
    """Wait until the sink's `STUCK_ALERT` fires (`firing`), or is inactive (not firing nor
    pending); print each state it passes, with the seconds since `since` (monotonic; `after`
    says what happened then) and every active alert. The seconds it took."""
    sink, deadline, last = deployment.config.sink_id, time.monotonic() + timeout, ""
    while True:
        try:
            state, active = alert_state(deployment.prometheus("alerts"), STUCK_ALERT, sink)
        except (OSError, ValueError, VerifyError) as error:
            state, active = f"unknown ({type(error).__name__}: {error})", []
        took = time.monotonic() - since
        if state != last:
            deployment.say(
                f"  {STUCK_ALERT}{{sink={sink}}} {state} {took:.1f}s after {after}; "
                f"active alerts: {', '.join(active) or 'none'}"
            )
            last = state
        if state == ("firing" if firing else "inactive"):
            return took
        if time.monotonic() > deadline:
            raise VerifyError(
                f"{STUCK_ALERT} for sink {sink} is {state}, not "
                f"{'firing' if firing else 'inactive'}, {took:.0f}s after {after}"
            )
        time.sleep(1.0)


def check_prometheus(deployment: Deployment, shard: Shard, timeout: float) -> dict[str, Any]:
    """The prometheus phase (module docs): targets up, rules evaluating, the sink's series
    recorded; then the stuck-sink alert fires when every append container is killed and
    resolves once they are back. Its figures."""
    say = deployment.say
    figures: dict[str, Any] = {
        "targets": check_targets(deployment),
        "rules": check_rules(deployment),
        "sink": check_sink_series(deployment),
    }
    # a clean start: the alert not active before the kill (a slow round may have made it so)
    wait_alert(deployment, False, time.monotonic(), "the check began", timeout)
    appenders = deployment.containers("append")
    engine.docker("kill", *appenders, check=True)
    killed = time.monotonic()
    say(f"  killed {', '.join(appenders)}: the sink has no append")
    figures["fired_after_kill"] = wait_alert(deployment, True, killed, "the kill", timeout)
    stopped = [c for c in appenders if not _running(c)]
    if stopped:  # `docker kill` is a manual stop: no restart policy applies
        engine.docker("start", *stopped, check=True, timeout=120)
        say(f"  started {', '.join(stopped)} again")
    started = time.monotonic()
    figures["resolved_after_start"] = wait_alert(deployment, False, started, "the start", timeout)
    figures["upper"] = wait_converged(deployment, shard, ADVANCE, timeout)
    figures["targets_after"] = check_targets(deployment)
    return figures


#: The topics whose last record the schema registry phase decodes, with the record each holds.
FRAMED = (
    ("desired", "DesiredRecord"),
    ("descs", "BatchDescription"),
    ("batches", "StagedBatch"),
    ("frontiers", None),  # DesiredProgress or ShardUpper
)


def check_registry(deployment: Deployment) -> dict[str, Any]:
    """The schema registry phase (module docs): the subjects and levels, and each framed topic's
    last record's schema id. Per topic, the id and the record kind it resolves to."""
    config = deployment.config
    found = registry.Registry(config.schema_registry_url)
    subjects = set(found.subjects())
    kinds = registry.topic_kinds(config.topics)
    wanted = {registry.subject(t, k) for t, ks in kinds.items() for k in ks}
    if missing := sorted(wanted - subjects):
        raise VerifyError(f"the registry lacks subjects {missing} (it holds {sorted(subjects)})")
    levels = {name: found.compatibility(name) for name in sorted(wanted)}
    if wrong := {n: lvl for n, lvl in levels.items() if lvl != registry.COMPATIBILITY}:
        raise VerifyError(f"subjects not at {registry.COMPATIBILITY}: {wrong}")
    deployment.say(f"  {len(wanted)} subjects registered, each {registry.COMPATIBILITY}")
    resolved: dict[str, Any] = {}
    for name, kind in FRAMED:
        topic = getattr(config.topics, name)
        message = last_message(config.kafka_bootstrap, topic)
        value = (message.value() if message is not None else None) or b""
        if value[:1] != b"\x00":
            raise VerifyError(f"{topic}[0]'s last record is not registry-framed: {value[:8]!r}")
        schema_id = int.from_bytes(value[1:5], "big")
        version = found.lookup(schema_id)
        if kind is not None and version.kind != kind:
            raise VerifyError(f"{topic}: schema id {schema_id} is {version.kind}, not {kind}")
        resolved[name] = (schema_id, version.kind)
        deployment.say(
            f"  {topic}: magic 0, schema id {schema_id} = {version.kind}/v{version.version}"
        )
    return resolved


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _down_stale(say: Say) -> None:
    """`down -v` every `mvsink-verify-*` project an interrupted run left behind."""
    listed = engine.docker("compose", "ls", "--all", "--format", "json")
    for project in json.loads(listed.stdout or "[]"):
        if str(project.get("Name", "")).startswith("mvsink-verify-"):
            say(f"  removing {project['Name']}, left behind by an interrupted run")
            engine.compose(
                ["down", "-v", "--remove-orphans"],
                project=project["Name"],
                env={**os.environ, "MVSINK_S3_ACCESS_KEY": "x", "MVSINK_S3_SECRET_KEY": "x"},
                check=False,
            )


def _running(container: str) -> bool:
    return engine.docker("inspect", "-f", "{{.State.Running}}", container).stdout.strip() == "true"


def _image_sizes(deployment: Deployment) -> dict[str, int]:
    names = sorted(set(deployment.compose("config", "--images").split()))
    sizes = {}
    for name in names:
        sizes[name] = int(
            engine.docker("image", "inspect", "-f", "{{.Size}}", name).stdout.strip() or 0
        )
    return sizes


def run_verify(
    home: Path, cache: Path, say: Say, *, keep: bool = False, timeout: float = 300.0
) -> dict[str, Any]:
    """The phases of the module docs; the figures (phase seconds, image sizes, work)."""
    phases = Phases(say)
    home.mkdir(parents=True, exist_ok=True)
    with phases.phase("engine"):
        engine.ensure_engine(home, say)
        engine.ensure_compose(cache, say)
    with phases.phase("base"):
        engine.ensure_base(home, say)
    _down_stale(say)
    deployment = _deployment(say)
    with phases.phase("build"):
        deployment.compose("build", timeout=3600)
    sizes = _image_sizes(deployment)
    for name, size in sizes.items():
        say(f"  image {name}: {size / 2**20:.0f} MiB")
    figures: dict[str, Any] = {"images": sizes, "project": deployment.project}
    failed = True
    try:
        with phases.phase("up"):
            scales = [arg for s, n in SCALE.items() for arg in ("--scale", f"{s}={n}")]
            deployment.compose("up", "-d", *scales, timeout=900)
        shard = open_shard(deployment.config.shard_id, None, deployment.config.s3)

        def converge() -> int:
            return wait_converged(deployment, shard, ADVANCE, timeout)

        with phases.phase("converge"):
            upper = converge()
        with phases.phase("scaled"):
            figures["work"] = check_scaled(deployment)
        with phases.phase("spark cluster"):
            figures["spark"] = check_spark(deployment, SCALE["spark-worker"])
        with phases.phase("prometheus"):
            figures["prometheus"] = check_prometheus(deployment, shard, timeout)
        with phases.phase("schema registry"):
            figures["registry"] = check_registry(deployment)
        with phases.phase("kill write and append"):
            writers, appenders = deployment.containers("write"), deployment.containers("append")
            victims = [writers[0], appenders[0]]
            killed_at = _now()
            engine.docker("kill", *victims, check=True)
            say(f"  killed {', '.join(victims)}")
            upper = converge()  # the survivors took over the victims' partitions and worker
            check_work_since(
                deployment, killed_at, {writers[1]: "write", appenders[1]: "append"}, timeout
            )
            stopped = [v for v in victims if not _running(v)]
            started_at = _now()
            if stopped:  # `docker kill` is a manual stop: no restart policy applies
                engine.docker("start", *stopped, check=True, timeout=120)
                say(f"  started {', '.join(stopped)} again")
            upper = converge()
            check_work_since(
                deployment, started_at, {writers[0]: "write", appenders[0]: "append"}, timeout
            )
        with phases.phase("kill spark-worker"):
            victim = deployment.containers("spark-worker")[0]
            killed_at = _now()
            engine.docker("kill", victim, check=True)
            say(f"  killed {victim}")
            upper = converge()  # the write drivers' tasks ran on the surviving worker's executors
            check_work_since(deployment, killed_at, {w: "write" for w in writers}, timeout)
            figures["spark_after_kill"] = check_spark(deployment, SCALE["spark-worker"] - 1)
            started_at = _now()
            if not _running(victim):  # `docker kill` is a manual stop: no restart policy applies
                engine.docker("start", victim, check=True, timeout=120)
                say(f"  started {victim} again")
            figures["spark_after_start"] = check_spark(deployment, SCALE["spark-worker"])
            upper = converge()
            check_work_since(deployment, started_at, {w: "write" for w in writers}, timeout)
        for component in ("kafka", "minio", "registry"):
            with phases.phase(f"restart {component}"):
                deployment.compose("restart", component, timeout=300)
                upper = converge()
        _, equal, odd = check_once(shard, deployment.config)
        figures.update(upper=upper, equal=equal, rows_with_diff_not_1=odd)
        with phases.phase("continual task"):
            figures["ct"] = check_ct(deployment, shard, upper, timeout)
        failed = False
    except Exception:
        try:
            deployment.diagnose(home)
        except Exception as error:  # never hide the error that got us here
            say(f"  diagnosing the containers failed: {error!r}")
        raise
    finally:
        if keep:
            say(
                f"[compose] --keep: project {deployment.project} left running "
                f"(docker compose -p {deployment.project} down -v)"
            )
        else:
            with phases.phase("down"):
                down = engine.compose(
                    ["down", "-v", "--remove-orphans"],
                    project=deployment.project,
                    env=deployment.env,
                    timeout=300,
                    check=False,
                )
                if down.returncode != 0:  # say so, but never hide the error that got us here
                    say(f"  docker compose down failed: {down.stderr[-2000:]}")
        say(phases.table())
        figures["seconds"] = phases.seconds
        if failed:
            say("[compose] verification FAILED")
    say(
        f"[compose] verification OK: shard == view at upper {figures['upper']}, "
        "no duplicates, through kills (a Spark worker's too) and restarts; Prometheus "
        f"scraped every replica and {STUCK_ALERT} fired and resolved"
    )
    return figures
