"""Embedded Spark cluster: a standalone master and N workers from the pip-installed PySpark.

PySpark's wheel carries Spark's launcher (`pyspark/bin/spark-class`) and jars, so the same
`org.apache.spark.deploy.master.Master` and `...worker.Worker` a Spark distribution runs start
here with no download. Every listener binds 127.0.0.1; the REST submission server is off (the
services connect as drivers, nothing submits through it).

* `SparkMaster.start` runs the master on `port` (RPC) and `ui_port` (web UI, whose `/json/` is
  the readiness check of the master and of its workers), giving each application that does not
  cap itself (`spark.cores.max`) `default_cores` cores (`spark.deploy.defaultCores`, default
  `APP_CORES`). Without that cap Spark gives the first application every core of the cluster
  and the next none, so a second driver (the demo's view job next to the write service) waits
  for executors until the first ends;
* `SparkWorker.start` runs worker `index` with `cores` and `memory`, registered with the master;
  it is ready when the master lists it ALIVE. Its executors (and their Python workers) are its
  children, in its process group: stopping or `kill -9`-ing the group takes them all.
"""

from __future__ import annotations

import json
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from mvsink.core.errors import StackError
from mvsink.stack import procs
from mvsink.stack.component import Component

#: The cores an application gets of the embedded cluster unless it sets `spark.cores.max`: two,
#: which the master spreads over the workers (`spark.deploy.spreadOut`), so on two or more
#: workers an application has an executor on two of them and outlives the loss of one. mvsink's
#: own applications cap themselves lower where several share a cluster (`[spark] cores_max`; the
#: demo gives its view job and its write driver one core each).
APP_CORES = 2


def spark_home() -> Path:
    """The Spark installation inside the installed PySpark package."""
    import pyspark

    home = Path(pyspark.__file__).parent
    if not (home / "bin" / "spark-class").exists():
        raise StackError(f"{home} has no bin/spark-class: reinstall pyspark from PyPI")
    return home


def _env(home: Path) -> dict[str, str]:
    spark = spark_home()
    return {
        **procs.base_env(),
        "SPARK_HOME": str(spark),
        "SPARK_LOCAL_IP": procs.LOOPBACK,
        "SPARK_LOG_DIR": str(home / "logs"),
        "SPARK_DAEMON_MEMORY": "512m",
    }


def _spark_class(home: Path, main: str, args: list[str], log: Path) -> int:
    procs.require_tool("java", "install a JDK 17 (Spark 4 needs 17+)")
    home.mkdir(parents=True, exist_ok=True)
    launcher = spark_home() / "bin" / "spark-class"
    return procs.spawn([str(launcher), main, *args], log=log, env=_env(home), cwd=home)


def cluster_status(ui_port: int) -> dict[str, object]:
    """The master's `/json/` view: status, alive workers, applications."""
    url = f"http://{procs.LOOPBACK}:{ui_port}/json/"
    with urllib.request.urlopen(url, timeout=2) as response:
        return dict(json.load(response))


def alive_worker_ports(ui_port: int) -> set[int]:
    """The RPC ports of the workers the master at `ui_port` lists ALIVE."""
    workers = cluster_status(ui_port).get("workers", [])
    assert isinstance(workers, list)
    return {int(w["port"]) for w in workers if w.get("state") == "ALIVE"}


@dataclass
class SparkMaster(Component):
    """The standalone master: RPC on `port`, web UI on `ui_port`."""

    PORTS = ("port", "ui_port")
    LOG = "master.log"

    ui_port: int
    #: Cores per application that does not set `spark.cores.max` (`spark.deploy.defaultCores`).
    default_cores: int = APP_CORES

    @property
    def address(self) -> str:
        """The master URL drivers connect to (`spark://host:port`)."""
        return f"spark://{procs.LOOPBACK}:{self.port}"

    def start(self, say: procs.Say) -> int:
        """Launch the master; its pid (not yet ready)."""
        props = self.home / "master.properties"
        self.home.mkdir(parents=True, exist_ok=True)
        props.write_text(
            f"spark.master.rest.enabled=false\nspark.deploy.defaultCores={self.default_cores}\n"
        )
        say(
            f"starting Spark master on {self.address} (web UI port {self.ui_port}; "
            f"{self.default_cores} cores per application unless it sets spark.cores.max) ..."
        )
        return _spark_class(
            self.home,
            "org.apache.spark.deploy.master.Master",
            [
                "--host",
                procs.LOOPBACK,
                "--port",
                str(self.port),
                "--webui-port",
                str(self.ui_port),
                "--properties-file",
                str(props),
            ],
            self.log,
        )

    def ready(self) -> bool:
        """Whether the master is the ALIVE leader."""
        return cluster_status(self.ui_port).get("status") == "ALIVE"


@dataclass
class SparkWorker(Component):
    """Standalone worker `index`, registered with `master` (its executors log in the `work`
    folder of its home)."""

    LOG = "worker.log"

    index: int
    master: SparkMaster
    cores: int
    memory: str

    def start(self, say: procs.Say) -> int:
        """Launch the worker; its pid (not yet ready)."""
        say(f"starting Spark worker {self.index} ({self.cores} cores, {self.memory}) ...")
        work = self.home / "work"
        work.mkdir(parents=True, exist_ok=True)
        return _spark_class(
            self.home,
            "org.apache.spark.deploy.worker.Worker",
            [
                "--host",
                procs.LOOPBACK,
                "--port",
                str(self.port),
                "--webui-port",
                "0",
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--work-dir",
                str(work),
                self.master.address,
            ],
            self.log,
        )

    def ready(self) -> bool:
        """Whether the master lists this worker ALIVE."""
        return self.port in alive_worker_ports(self.master.ui_port)


def worker_memory(workers: int) -> str:
    """Memory per worker for executors: a share of this machine's, at most 4 GiB."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 8 << 30
    share = max(1 << 30, min(4 << 30, total // (4 * max(1, workers))))
    return f"{share >> 20}m"
