"""The write service on a Spark standalone cluster whose executors' Python has none of mvsink's
libraries (`[spark] pack_env`, `mvsink.io.spark.packed_env`).

A bare worker is modelled the way a cluster without mvsink's dependencies looks to a driver:
the executors' Python (`PYSPARK_PYTHON`, which the driver names for them) is a virtualenv of
the same Python installation with nothing installed in it. Without packing, the write tasks
fail to import their libraries there; with packing, the driver ships this virtualenv's
libraries as an archive (`spark.archives`), the executors run `./env/bin/python` from it, and
the sink converges."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sinkkit import Service, Sink, Upstream, contents, converged, start, wait_until

from mvsink.io.config import cache_dir
from mvsink.io.spark import packed_env
from mvsink.stack.manager import Stack

# One cluster serves the module (`cluster`): its tests run on one worker.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("packed-env")]

LIBRARIES = ("pyarrow", "confluent_kafka", "minio", "fastavro")


class Cluster:
    """A Spark standalone cluster of this module's own: 2 workers of 1 core."""

    def __init__(self, home: Path) -> None:
        self.stack = Stack(home, cache_dir(), lambda m: print(f"[cluster] {m}", flush=True))
        self.home = home
        self.url = self.stack.spark_up(2) or ""

    def python_workers(self) -> list[list[str]]:
        """The command line of every PySpark Python process of the workers' executors now: those
        working in an executor's directory under this cluster's home (the PySpark daemon leads a
        process group of its own, so the workers' groups do not hold them)."""
        home = self.home.resolve()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                args = (entry / "cmdline").read_bytes().decode().split("\0")
                where = (entry / "cwd").resolve()
            except OSError:
                continue
            if {"pyspark.daemon", "pyspark.worker"} & set(args) and where.is_relative_to(home):
                found.append(args)
        return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("bare-cluster"))
    try:
        yield cluster
    finally:
        cluster.stack.down()


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A virtualenv of this Python's own installation with nothing installed (no pip, no system
    site packages): the Python of a bare worker."""
    venv = tmp_path_factory.mktemp("bare-python") / "venv"
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    for library in LIBRARIES:
        tried = subprocess.run([str(python), "-c", f"import {library}"], capture_output=True)
        assert tried.returncode != 0, f"{python} imports {library}: not a bare Python"
    return str(python)


def _start_sink(procs: list[Service], sink: Sink, cluster: Cluster, **write_env: str) -> Service:
    start(procs, sink, "mint")
    start(procs, sink, "append")
    return start(procs, sink, "write", MVSINK_SPARK_MASTER=cluster.url, **write_env)


def test_without_packing_bare_executors_cannot_run_the_write_tasks(
    sink: Sink, cluster: Cluster, bare_python: str, procs: list[Service]
) -> None:
    """The model is faithful: on the bare Python the executors fail to import the libraries."""
    write = _start_sink(procs, sink, cluster, PYSPARK_PYTHON=bare_python)
    wait_until(
        lambda: "ModuleNotFoundError: No module named" in write.text(), 240, "the import error"
    )
    missing = write.text().split("ModuleNotFoundError: No module named ")[1].split()[0]
    assert missing.strip("'\"").split(".")[0] in LIBRARIES, missing


def test_with_packing_the_write_service_converges_on_bare_executors(
    sink: Sink, cluster: Cluster, bare_python: str, procs: list[Service], tmp_path: Path
) -> None:
    """`MVSINK_SPARK_PACK_ENV=true`: the driver builds the archive (in its own temporary
    directory, so this run builds it), its executors run the packed Python, and the shard
    equals the view with every diff 1. The archive it built: built once per content (asked
    again here, the same file, not rewritten), holding the interpreter's links, pyvenv.cfg and
    mvsink's libraries; not PySpark (the cluster's), matplotlib (the driver's chart) or mvsink's
    editable install (the code zip ships the code)."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    write = _start_sink(
        procs,
        sink,
        cluster,
        PYSPARK_PYTHON=bare_python,
        MVSINK_SPARK_PACK_ENV="true",
        TMPDIR=str(temporary),
    )
    upstream = Upstream(sink)
    for _ in range(4):
        upstream.tick()
        time.sleep(0.5)
    wait_until(lambda: converged(sink, upstream), 300, "convergence on bare executors")
    assert all(d == 1 for d in contents(sink, upstream.frontier).values())
    text = write.text()
    assert f"Spark {cluster.url}: executors ['0', '1']" in text, text[-3000:]
    assert "packed " in text and " distributions of " in text, text[-3000:]
    built = list(temporary.glob("mvsink-env-*.tar.gz"))
    assert built, os.listdir(temporary)
    pythons = {args[0] for args in cluster.python_workers()}
    assert pythons == {"./env/bin/python"}, pythons

    [archive] = built
    stamp = archive.stat().st_mtime_ns
    started = time.monotonic()
    assert packed_env(temporary) == archive and archive.stat().st_mtime_ns == stamp
    again = time.monotonic() - started
    print(f"packed {archive.stat().st_size / 2**20:.0f} MiB; asked again {again:.2f}s")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    site = f"lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
    assert {"bin/python", "pyvenv.cfg"} <= names
    for library in LIBRARIES:
        assert f"{site}/{library}/__init__.py" in names, library
    for left_out in ("pyspark/", "py4j/", "matplotlib/", "__editable__", "mvsink"):
        assert not [n for n in names if n.startswith(f"{site}/{left_out}")], left_out
