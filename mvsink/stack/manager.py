"""`mvsink stack up|down|status`: a real Kafka and a real MinIO on loopback, from registries.

Steps of `up`, each idempotent, so a rerun after any failure picks up where it stopped:

1. resolve the Kafka jars (Maven Central) and build MinIO (`go install`) into the cache, and
   with `schema_registry=True` fetch the Schema Registry's distribution (Maven Central), in
   parallel, once per cache;
2. reuse the ports recorded by the last start if they are still free, else pick free ones;
3. start each component that is not running, record its pid, wait until it answers;
4. with `schema_registry=True`: a Confluent-compatible Schema Registry (`mvsink.stack.registry`,
   Apicurio), optional because nothing needs it unless `schema_registry_url` is set; `up` without
   it leaves a running one alone;
5. with `spark_workers=N`: a Spark standalone master and workers 1..N (`mvsink.stack.spark`),
   stopping workers above N, so `up` again with another N scales the cluster;
6. (the CLI) provision the sink's topics and bucket.

Without a cluster, Spark jobs run `local[*]` in-process (`mvsink.io.spark`); with one, a service
uses it when its `spark.master` (`MVSINK_SPARK_MASTER`) names it (`mvsink stack env` prints it).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from mvsink.stack import kafka, minio, procs, registry, spark
from mvsink.stack.state import (
    ComponentRecord,
    credentials,
    load_records,
    registry_url,
    save_records,
)


@dataclass(frozen=True)
class Endpoints:
    """How clients reach a running stack."""

    kafka_bootstrap: str
    s3_endpoint: str
    s3_access_key: str
    s3_secret_key: str
    #: The Schema Registry's Confluent-compatible API, "" when it does not run.
    schema_registry_url: str = ""


@dataclass(frozen=True)
class ComponentStatus:
    """One line of `mvsink stack status`."""

    name: str
    state: str
    address: str
    pid: int | None
    log: str


def _quiet(_: str) -> None:
    return None


class Stack:
    """The embedded stack rooted at `home`, with downloads and builds cached in `cache`.

    `mvsink stack up` uses `<state>/stack`; the test fixtures use a fresh temporary home each
    session (own ports and data) with the shared cache, so parallel runs never clash.
    """

    def __init__(self, home: Path, cache: Path, say: procs.Say = _quiet) -> None:
        self.home = home
        self.cache = cache
        self.say = say

    # -- up -----------------------------------------------------------------------------------

    def up(
        self,
        timeout: float = 180.0,
        spark_workers: int | None = None,
        spark_cores: int = 1,
        schema_registry: bool = False,
    ) -> Endpoints:
        """Build what is missing, start what is not running, wait until all answer; with
        `schema_registry`, a Schema Registry too; with `spark_workers` (0 stops the cluster), a
        Spark cluster of that many workers."""
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=3) as pool:
            libs_future = pool.submit(kafka.ensure_libs, self.cache, self.say)
            binary_future = pool.submit(minio.ensure_binary, self.cache, self.say)
            server_future = (
                pool.submit(registry.ensure_server, self.cache, self.say)
                if schema_registry
                else None
            )
            libs, binary = libs_future.result(), binary_future.result()
            if server_future is not None:
                server_future.result()
        records = load_records(self.home)
        access_key, secret_key = credentials(self.home)
        kafka_node = self._kafka_node(records.get("kafka"))
        minio_node = self._minio_node(records.get("minio"))
        if not _running(records.get("kafka")):
            pid = kafka_node.start(libs, self.say)
            records["kafka"] = kafka_node.record("kafka", pid)
            save_records(self.home, records)
        if not _running(records.get("minio")):
            pid = minio_node.start(binary, access_key, secret_key, self.say)
            records["minio"] = minio_node.record("minio", pid)
            save_records(self.home, records)
        procs.wait_ready(
            "Kafka", kafka_node.ready, pid=records["kafka"].pid, log=kafka_node.log, timeout=timeout
        )
        procs.wait_ready(
            "MinIO", minio_node.ready, pid=records["minio"].pid, log=minio_node.log, timeout=timeout
        )
        schema_registry_url = self.registry_up(timeout) if schema_registry else self.registry_url()
        if spark_workers is not None:
            self.spark_up(spark_workers, spark_cores, timeout)
        self.say(f"stack up in {time.monotonic() - started:.1f}s")
        return Endpoints(
            kafka_node.address, minio_node.address, access_key, secret_key, schema_registry_url
        )

    def _kafka_node(self, record: ComponentRecord | None) -> kafka.KafkaNode:
        ports = _reuse_ports(record, kafka.KafkaNode.PORTS)
        return kafka.KafkaNode(self.home / "kafka", ports["port"], ports["controller_port"])

    def _minio_node(self, record: ComponentRecord | None) -> minio.MinioNode:
        ports = _reuse_ports(record, minio.MinioNode.PORTS)
        return minio.MinioNode(self.home / "minio", ports["port"], ports["console_port"])

    def registry_up(self, timeout: float = 180.0) -> str:
        """Run the Schema Registry (fetching it first if it is not in the cache); the URL of its
        Confluent-compatible API. Needs nothing else of the stack, so a test can run it alone."""
        server = registry.ensure_server(self.cache, self.say)
        records = load_records(self.home)
        ports = _reuse_ports(records.get(REGISTRY), registry.RegistryNode.PORTS)
        node = registry.RegistryNode(self.home / REGISTRY, ports["port"])
        if not _running(records.get(REGISTRY)):
            pid = node.start(server, self.say)
            records[REGISTRY] = node.record(REGISTRY, pid)
            save_records(self.home, records)
        procs.wait_ready(
            "Schema Registry", node.ready, pid=records[REGISTRY].pid, log=node.log, timeout=timeout
        )
        return node.url

    def registry_url(self) -> str:
        """The running Schema Registry's Confluent-compatible API, "" if none runs."""
        record = load_records(self.home).get(REGISTRY)
        return registry_url(record.address) if record is not None and record.alive else ""

    def spark_up(self, workers: int, cores: int = 1, timeout: float = 180.0) -> str | None:
        """Run a Spark master and exactly `workers` workers (stopping those above; 0 stops
        the cluster); the master URL (None when stopped)."""
        records = load_records(self.home)
        for name in sorted(n for n in records if n.startswith(SPARK_WORKER)):
            if int(name.removeprefix(SPARK_WORKER)) > workers or workers == 0:
                self._stop(records.pop(name))
                save_records(self.home, records)
        if workers == 0:
            if SPARK_MASTER in records:
                self._stop(records.pop(SPARK_MASTER))
            save_records(self.home, records)
            return None
        ports = _reuse_ports(records.get(SPARK_MASTER), spark.SparkMaster.PORTS)
        master = spark.SparkMaster(self.home / "spark", ports["port"], ports["ui_port"])
        if not _running(records.get(SPARK_MASTER)):
            pid = master.start(self.say)
            records[SPARK_MASTER] = master.record(SPARK_MASTER, pid)
            save_records(self.home, records)
        procs.wait_ready(
            "Spark master",
            master.ready,
            pid=records[SPARK_MASTER].pid,
            log=master.log,
            timeout=timeout,
        )
        memory = spark.worker_memory(workers)
        started = []
        for index in range(1, workers + 1):  # start them all, then wait for each
            name = f"{SPARK_WORKER}{index}"
            port = _reuse_ports(records.get(name), spark.SparkWorker.PORTS)["port"]
            worker = spark.SparkWorker(
                self.home / "spark" / name, port, index, master, cores, memory
            )
            if not _running(records.get(name)):
                pid = worker.start(self.say)
                records[name] = worker.record(name, pid)
                save_records(self.home, records)
            started.append((name, worker))
        for name, worker in started:
            procs.wait_ready(
                f"Spark worker {worker.index}",
                worker.ready,
                pid=records[name].pid,
                log=worker.log,
                timeout=timeout,
            )
        return master.address

    def _stop(self, record: ComponentRecord) -> None:
        if record.alive:
            self.say(f"stopping {record.name} (pid {record.pid}) ...")
            procs.stop(record.pid)

    # -- down / status ----------------------------------------------------------------------------

    def down(self) -> list[str]:
        """Stop the components this stack started; the names of those that were running."""
        records = load_records(self.home)
        stopped = []
        for name, record in reversed(records.items()):  # workers before their master
            if record.alive:
                self._stop(record)
                stopped.append(name)
        return stopped

    def status(self) -> list[ComponentStatus]:
        """Each recorded component: running or stopped, address, pid, log."""
        records = load_records(self.home)
        rows = []
        spark_names = sorted(n for n in records if n.startswith("spark-"))
        optional = [REGISTRY] if REGISTRY in records else []
        for name in ("kafka", "minio", *optional, *spark_names):
            record = records.get(name)
            if record is None:
                rows.append(ComponentStatus(name, "never started", "-", None, "-"))
                continue
            state = "running" if record.alive else "stopped"
            rows.append(ComponentStatus(name, state, record.address, record.pid, record.log))
        return rows


REGISTRY = "registry"
SPARK_MASTER = "spark-master"
SPARK_WORKER = "spark-worker-"


def _running(record: ComponentRecord | None) -> bool:
    return record is not None and record.alive


def _reuse_ports(record: ComponentRecord | None, names: tuple[str, ...]) -> dict[str, int]:
    """The recorded ports if the component still runs or they are all free, else fresh ones."""
    recorded = record is not None and all(n in record.ports for n in names)
    if (
        record is not None
        and recorded
        and (record.alive or all(procs.port_is_free(record.ports[n]) for n in names))
    ):
        return {n: record.ports[n] for n in names}
    return dict(zip(names, procs.free_ports(len(names)), strict=True))
