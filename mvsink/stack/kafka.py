"""Embedded Kafka: the Apache Kafka broker from Maven Central, one KRaft node on loopback.

* `ensure_libs` resolves `maven/kafka.pom.xml` (kafka_2.13 + the log4j2 SLF4J binding) into the
  cache with `mvsink.stack.jars.resolve`, once.
* `KafkaNode.start` writes `server.properties` (combined broker+controller, static quorum on
  127.0.0.1), formats the storage with `kafka.tools.StorageTool` on first start, runs
  `kafka.Kafka`, and is ready when a metadata request succeeds.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from mvsink.core.errors import StackError
from mvsink.stack import jars, procs
from mvsink.stack.component import Component

KAFKA_VERSION = "4.1.1"


def ensure_libs(cache: Path, say: procs.Say) -> Path:
    """The directory of broker jars, resolving them from Maven Central if not cached yet."""
    return jars.resolve(
        "kafka.pom.xml",
        cache / "kafka" / KAFKA_VERSION / "libs",
        say,
        f"Kafka {KAFKA_VERSION} broker jars",
    )


@dataclass
class KafkaNode(Component):
    """One combined broker+controller: clients bootstrap from its `address` (`port`); the
    controller listens on `controller_port`."""

    PORTS = ("port", "controller_port")
    LOG = "kafka.log"

    controller_port: int

    def start(self, libs: Path, say: procs.Say) -> int:
        """Configure, format (first start only) and launch the broker; its pid (not yet ready)."""
        java = procs.java()
        self.home.mkdir(parents=True, exist_ok=True)
        props = self._write_config()
        classpath = f"{libs}/*"
        data = self.home / "data"
        if not (data / "meta.properties").exists():
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            procs.run_checked(
                # `=` form: a random id may start with "-" and must not parse as an option.
                [
                    java,
                    "-cp",
                    classpath,
                    "kafka.tools.StorageTool",
                    "format",
                    f"--cluster-id={cluster_id}",
                    f"--config={props}",
                ],
                log=self.home / "format.log",
                what="formatting Kafka KRaft storage",
            )
        say(f"starting Kafka on {self.address} ...")
        return procs.spawn(
            [
                java,
                "-Xms256m",
                "-Xmx768m",
                "-XX:+UseG1GC",
                "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
                "-cp",
                classpath,
                "kafka.Kafka",
                str(props),
            ],
            log=self.home / "kafka.stdout",
            env=procs.base_env(),
            cwd=self.home,
        )

    def ready(self) -> bool:
        """Whether the broker is ready (`kafka_ready`)."""
        return kafka_ready(self.address)

    def _write_config(self) -> Path:
        loopback = procs.LOOPBACK
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{loopback}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{loopback}:{self.port},"
            f"CONTROLLER://{loopback}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{loopback}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.home / "data"),
            "auto.create.topics.enable": "false",
            # One node: every internal topic has one replica; few partitions keep starts quick.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # Compacted topics (frontiers, control) get cleaned promptly.
            "log.cleaner.backoff.ms": "1000",
            # Segments wholly below a partition's log start (desired records the write service
            # deleted) leave the disk within a second of rolling rather than 5 min.
            "log.retention.check.interval.ms": "1000",
        }
        props = self.home / "server.properties"
        props.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        (self.home / "log4j2.properties").write_text(
            "rootLogger.level=INFO\n"
            "rootLogger.appenderRef.file.ref=file\n"
            "appender.file.type=File\n"
            "appender.file.name=file\n"
            f"appender.file.fileName={self.log}\n"
            "appender.file.layout.type=PatternLayout\n"
            "appender.file.layout.pattern=[%d] %p %m (%c)%n\n"
            "logger.kafka.name=kafka\nlogger.kafka.level=INFO\n"
            "logger.apache.name=org.apache\nlogger.apache.level=WARN\n"
        )
        return props


def topic_bytes(libs: Path, bootstrap: str, topic: str, timeout: float = 60.0) -> dict[int, int]:
    """Each partition's size on the brokers' disks (Kafka's DescribeLogDirs, through the
    `LogDirsCommand` of the broker jars in `libs`): the bytes of its segments, summed over the
    replicas' log directories."""
    result = subprocess.run(
        [
            "java",
            "-cp",
            f"{libs}/*",
            "org.apache.kafka.tools.LogDirsCommand",
            "--bootstrap-server",
            bootstrap,
            "--describe",
            "--topic-list",
            topic,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise StackError(f"describing the log dirs of {topic} failed: {result.stderr[-500:]}")
    sizes: dict[int, int] = {}
    for broker in json.loads(lines[-1])["brokers"]:
        for log_dir in broker["logDirs"]:
            for partition in log_dir["partitions"]:
                number = int(partition["partition"].rsplit("-", 1)[1])
                sizes[number] = sizes.get(number, 0) + int(partition["size"])
    return sizes


def kafka_ready(bootstrap: str) -> bool:
    """Whether a metadata request to the broker at `host:port` succeeds."""
    from confluent_kafka.admin import AdminClient

    host, port = bootstrap.rsplit(":", 1)
    if host == procs.LOOPBACK and not procs.accepts_connections(int(port)):
        return False  # spare librdkafka's connect-retry noise
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    metadata = admin.list_topics(timeout=2)
    return len(metadata.brokers) > 0
