"""Spark for mvsink: a session factory tuned for a small box, executor-side Parquet I/O against
object storage (pyarrow + the S3 client inside `mapInArrow`; no Hadoop S3 connector), and tasks
pinned to executors.

The session is built from the `[spark]` settings of a `Config` (`spark_session(config=...)`):
`local[*]` by default; `[spark] master` points at a cluster instead: any master Spark accepts
(`spark://…`, `yarn`, `k8s://…`). On a cluster:

* **Code.** The executors get the project's own code the way Spark's Python package
  management recommends for pure-Python code: `code_zip` packs the `mvsink` and `services`
  packages this driver runs (a content-addressed zip, built at session start) and the session
  ships it with `spark.submit.pyFiles`; PySpark puts it first on each Python worker's path.
* **Libraries.** The third-party libraries (pyarrow, confluent-kafka, minio, fastavro, ...) are
  either in the executors' Python already (`PYSPARK_PYTHON`, by default this interpreter's path;
  the services image has them), or, with `pack_env` (`[spark] pack_env`), shipped: `packed_env`
  packs this virtualenv's distributions that mvsink needs with venv-pack (content-addressed by
  the Python and those distributions' versions, built once), and the session ships the archive
  with `spark.archives` (`<archive>#env`) and names `./env/bin/python` as the executors' Python,
  the way Spark documents it for virtualenvs (`PYSPARK_PYTHON` when the context is made); the
  driver keeps its own. Spark unpacks it in each executor's directory. The packed `bin/python`
  links to the virtualenv's base interpreter (`pyvenv.cfg` `home`), so the workers need that
  Python (the same version at the same path), nothing installed in it.
* **Cores.** `cores_max` (`[spark] cores_max`) caps the cores the application takes of a
  standalone cluster (`spark.cores.max`); unset, the master's `spark.deploy.defaultCores`
  applies (the embedded master's and compose's are set, `mvsink.stack.spark`): without either
  the first application takes every core and the next gets no executor.
* **Addresses.** Executors connect back to the driver at `[spark] driver_host`
  (`MVSINK_SPARK_DRIVER_HOST`, default 127.0.0.1; `auto` is this machine's hostname, as in a
  container). The driver binds 127.0.0.1 when that is loopback, else every interface.
* **Placement.** `executor_id` tells a task which executor it runs in and `live_executors` the
  driver which executors exist; `run_pinned` runs each group of work with a preferred executor
  (Spark's executor locality, delay scheduling), so state an executor keeps stays in use.
"""

from __future__ import annotations

import gc
import hashlib
import importlib.metadata
import io
import logging
import os
import platform
import socket
import sys
import sysconfig
import tempfile
import time
import uuid
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from mvsink.core.errors import ConfigError
from mvsink.core.settings import S3Settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from mvsink.io.config import Config

T = TypeVar("T")
R = TypeVar("R")
PART_RESULT_SCHEMA = "key string, rows long, bytes long"
log = logging.getLogger("mvsink.io.spark")


def spark_session(
    app_name: str = "mvsink",
    master: str | None = None,
    *,
    ui: bool = False,
    shuffle_partitions: int | None = None,
    conf: Mapping[str, str] | None = None,
    cores_max: int | None = None,
    pack_env: bool | None = None,
    config: Config | None = None,
    archive: bool = True,
) -> SparkSession:
    """A SparkSession for this box: few shuffle partitions, UI off unless asked, quiet logs,
    Arrow on, executors running this interpreter, every listener on 127.0.0.1.

    On a cluster it also ships the code (`code_zip`), caps the application at `cores_max`
    cores (0: no cap of its own) and with `pack_env` ships this virtualenv (`packed_env`) as
    the executors' Python. `master`, `cores_max`, `pack_env`, the driver's host (`driver_host`)
    and JVM options (`driver_java_options`) not given are `config`'s `[spark]` settings;
    without a `config` (a test's session), each setting's own variable or default
    (`mvsink.io.config.env_setting`).

    The driver's JVM maps this machine's archive of Spark's classes where it is built
    (`mvsink.io.spark_classes`; `archive=False`: never)."""
    from pyspark.sql import SparkSession

    # Here, not at the top: executors import this module, and need no configuration.
    from mvsink.io import spark_classes
    from mvsink.io.config import cache_dir, env_setting

    def setting(name: str) -> Any:
        return env_setting(name) if config is None else getattr(config, name)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    host = driver_host(setting("spark_driver_host"))
    if host.startswith("127."):
        os.environ.setdefault("SPARK_LOCAL_IP", host)
    cores = os.cpu_count() or 2
    master = master or setting("spark_master")
    cluster: dict[str, str] = {}
    executor_python = None
    if not master.startswith("local"):
        cluster["spark.submit.pyFiles"] = str(code_zip())
        cores_max = setting("spark_cores_max") if cores_max is None else cores_max
        if cores_max > 0:
            cluster["spark.cores.max"] = str(cores_max)
        if setting("spark_pack_env") if pack_env is None else pack_env:
            cluster["spark.archives"] = f"{packed_env()}#{PACKED_ENV}"
            executor_python = f"./{PACKED_ENV}/bin/python"
    settings = {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.ui.enabled": str(ui).lower(),
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(shuffle_partitions or 2 * cores),
        "spark.default.parallelism": str(2 * cores),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.host": host,
        "spark.driver.bindAddress": host if host.startswith("127.") else "0.0.0.0",
        "spark.driver.memory": "2g",
        "spark.python.worker.reuse": "true",
        # The executor JVM talks to its Python workers over a Unix socket instead of loopback
        # TCP: less fixed cost per job, and the write service runs a job per batch description,
        # so that cost is per-description latency.
        "spark.python.unix.domain.socket.enabled": "true",
        "spark.log.level": "WARN",
        **cluster,
        **(conf or {}),
    }
    settings = spark_classes.merged(settings, setting("spark_driver_java_options"))
    if archive:
        settings = spark_classes.merged(settings, spark_classes.driver_options(cache_dir()))
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    if executor_python is None:
        return builder.getOrCreate()
    # The context takes the executors' Python from PYSPARK_PYTHON when it is made; afterwards
    # the variable is this interpreter again, for whatever this process starts next.
    own = os.environ["PYSPARK_PYTHON"]
    os.environ["PYSPARK_PYTHON"] = executor_python
    try:
        return builder.getOrCreate()
    finally:
        os.environ["PYSPARK_PYTHON"] = own


def driver_host(setting: str | None = None) -> str:
    """Where executors reach the driver: `setting` (`Config.spark_driver_host`; None: its
    variable `MVSINK_SPARK_DRIVER_HOST` or default), `auto` meaning the hostname."""
    if setting is None:
        from mvsink.io.config import env_setting

        setting = str(env_setting("spark_driver_host"))
    host = setting.strip() or "127.0.0.1"
    return socket.gethostname() if host == "auto" else host


#: What is shipped to executors: the packages' Python files, and the Avro schemas they read.
CODE_PACKAGES = ("mvsink", "services")


def code_zip(directory: Path | None = None) -> Path:
    """A zip of the `mvsink` and `services` packages as this process imports them (their `.py`
    files) and of `schemas/`, named by the hash of its contents, built once per content in
    `directory` (default: the temporary directory)."""
    import importlib

    from mvsink.core.codec import SCHEMAS_DIR

    trees = [
        (name, Path(importlib.import_module(name).__file__ or "").parent, "*.py")
        for name in CODE_PACKAGES
    ]
    trees.append(("schemas", Path(str(SCHEMAS_DIR)), "*"))
    files: list[tuple[str, bytes]] = []
    for name, root, pattern in trees:
        for path in sorted(root.rglob(pattern)):
            if path.is_file() and "__pycache__" not in path.parts:
                files.append((f"{name}/{path.relative_to(root).as_posix()}", path.read_bytes()))
    digest = hashlib.sha256()
    for arcname, data in files:
        digest.update(arcname.encode() + b"\0" + data)
    target = (
        directory or Path(tempfile.gettempdir())
    ) / f"mvsink-code-{digest.hexdigest()[:16]}.zip"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for arcname, data in files:
                # A fixed date: the same sources make the same bytes.
                archive.writestr(zipfile.ZipInfo(arcname, (2020, 1, 1, 0, 0, 0)), data)
        partial.replace(target)
    return target


#: The packed environment's directory in an executor (`spark.archives` `<archive>#env`).
PACKED_ENV = "env"
#: Distributions `packed_env` leaves out: the cluster's own Spark (its executors put their
#: `pyspark` and `py4j` first on the path anyway), mvsink itself (`code_zip` ships the code
#: this driver runs, not an install that may be editable), and what only a driver runs (the
#: benchmark chart, the packer).
NOT_PACKED = frozenset({"mvsink", "pyspark", "py4j", "matplotlib", "venv-pack"})
#: Bumped when what `packed_env` puts in an archive changes, so older archives are not reused.
PACK_LAYOUT = 1


def packed_distributions(root: str = "mvsink") -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions `packed_env` packs, by normalized name (PEP 503): what `root`
    requires, transitively (with the extras each requirement names), as installed, but none of
    `NOT_PACKED` nor what only they require. A requirement whose marker is false here (another
    platform, an extra not asked for) is skipped, and so is one that is not installed."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    while todo:
        name, extras = todo.pop()
        key = canonicalize_name(name)
        if key in found or (key in NOT_PACKED and key != canonicalize_name(root)):
            continue
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        found[key] = distribution
        for text in distribution.requires or []:
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in extras or {""}):
                todo.append((requirement.name, frozenset(requirement.extras)))
    found.pop(canonicalize_name(root), None)
    return found


def pack_key(python: str, base: str, versions: Mapping[str, str]) -> str:
    """The content address of a packed environment: the Python (`python`, implementation,
    version and platform), its installation (`base`, where the packed `bin/python` links to),
    each packed distribution's version, and `PACK_LAYOUT`."""
    digest = hashlib.sha256(f"layout {PACK_LAYOUT}\npython {python}\nbase {base}\n".encode())
    for name in sorted(versions):
        digest.update(f"{name}=={versions[name]}\n".encode())
    return digest.hexdigest()[:16]


def packed_env(directory: Path | None = None) -> Path:
    """A `.tar.gz` of this virtualenv (venv-pack) holding only `packed_distributions` and its
    `python` links, named by `pack_key` and built once per key in `directory` (default: the
    temporary directory), for `spark.archives`.

    Raises:
        ConfigError: this Python is not a virtualenv, or venv-pack refuses it.
    """
    if sys.prefix == sys.base_prefix:
        raise ConfigError(
            f"[spark] pack_env: {sys.executable} does not run in a virtualenv, which venv-pack "
            "packs; run mvsink from one (./run setup makes .mvsink/venv)"
        )
    distributions = packed_distributions()
    python = f"{sys.implementation.name}-{platform.python_version()}-{sysconfig.get_platform()}"
    versions = {name: d.version for name, d in distributions.items()}
    key = pack_key(python, sys.base_prefix, versions)
    target = (directory or Path(tempfile.gettempdir())) / f"mvsink-env-{key}.tar.gz"
    if target.exists():
        return target
    import venv_pack  # type: ignore[import-untyped]  # venv-pack has no type hints

    started = time.monotonic()
    try:
        env = venv_pack.Env(sys.prefix)
    except venv_pack.VenvPackException as error:
        raise ConfigError(
            f"[spark] pack_env: venv-pack cannot pack {sys.prefix}: {error}"
        ) from error
    # Everything out, then in again: the interpreter's links and the packed distributions'
    # top-level files and folders in site-packages (pyvenv.cfg venv-pack adds itself).
    env = env.exclude("*").include("bin/python*").include("lib64")
    sites = {
        os.path.relpath(sysconfig.get_path(kind), env.prefix) for kind in ("purelib", "platlib")
    }
    for distribution in distributions.values():
        for top in _top_levels(distribution):
            for site in sites:
                env = env.include(f"{site}/{top}").include(f"{site}/{top}/*")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    env.pack(output=str(partial), format="tar.gz", force=True)
    partial.replace(target)
    log.info(
        "packed %d distributions of %s into %s (%.0f MiB) in %.1fs",
        len(distributions),
        sys.prefix,
        target,
        target.stat().st_size / 2**20,
        time.monotonic() - started,
    )
    return target


def _top_levels(distribution: importlib.metadata.Distribution) -> set[str]:
    """The names a distribution installed at the top of site-packages (its RECORD's first path
    parts; files outside site-packages, such as scripts, left out)."""
    files = distribution.files
    if files is None:  # no RECORD: its import names, at least
        text = distribution.read_text("top_level.txt") or ""
        return {line.strip() for line in text.splitlines() if line.strip()}
    return {f.parts[0] for f in files if f.parts and f.parts[0] != ".."}


def executor_id() -> str:
    """The id of the Spark executor this (Python worker) process serves: `driver` in local
    mode. Every cluster manager launches an executor as `CoarseGrainedExecutorBackend
    --executor-id <id>`, and a Python worker is that JVM's child (or grandchild, through
    PySpark's daemon), so the id is read from the nearest ancestor's command line (a few
    `/proc` reads). A worker serves one executor for its whole life: a caller that asks often
    keeps the answer."""
    pid = os.getppid()
    for _ in range(4):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"--executor-id" in args:
                return args[args.index(b"--executor-id") + 1].decode()
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
        if pid <= 1:
            break
    return "driver"


def executor_dir() -> Path:
    """A directory private to this executor, shared by its Python workers and removed with it:
    the first of Spark's local directories for it (`SPARK_LOCAL_DIRS`)."""
    local = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0]
    return Path(local or tempfile.gettempdir()) / "mvsink"


def live_executors(spark: SparkSession) -> dict[str, str]:
    """The executors alive now, id -> host (local mode: `{"driver": host}`)."""
    sc = spark.sparkContext
    status = sc._jsc.sc().env().blockManager().master().getMemoryStatus()
    found: dict[str, str] = {}
    keys = status.keysIterator()
    while keys.hasNext():
        block_manager = keys.next()
        found[str(block_manager.executorId())] = str(block_manager.host())
    if len(found) > 1:
        found.pop("driver", None)  # on a cluster the driver runs no tasks
    return found


def task_slots(spark: SparkSession) -> int:
    """How many tasks the live executors run at once (their cores over `spark.task.cpus`), at
    least 1. Not `defaultParallelism`, which `spark_session` sets to twice the cores."""
    sc: Any = spark.sparkContext._jsc.sc()
    profile = sc.resourceProfileManager().defaultResourceProfile()
    return max(1, int(sc.maxNumConcurrentTasks(profile)))


def run_pinned(
    spark: SparkSession, work: Sequence[tuple[T, str | None]], run: Callable[[T], Iterable[R]]
) -> list[R]:
    """`run(item)` for each `(item, executor)` of `work`, one task per item, preferring that
    executor (`None`: anywhere); every result, in order. Spark waits `spark.locality.wait`
    (3 s) for a busy preferred executor, and schedules anywhere when it is gone. Each task
    first freezes its worker's heap (`freeze_worker_heap`)."""
    from pyspark import RDD
    from pyspark.serializers import CPickleSerializer

    sc = spark.sparkContext
    jvm: Any = sc._jvm
    serializer: Any = CPickleSerializer()
    executors = live_executors(spark)
    scala = jvm.scala.jdk.javaapi.CollectionConverters
    pairs = jvm.java.util.ArrayList()
    for item, executor in work:
        where = jvm.java.util.ArrayList()
        if executor in executors:
            where.add(f"executor_{executors[executor]}_{executor}")
        pairs.add(jvm.scala.Tuple2(bytearray(serializer.dumps(item)), scala.asScala(where).toSeq()))
    tag = jvm.scala.reflect.ClassTag.apply(jvm.java.lang.Class.forName("[B"))
    rdd: Any = RDD(
        sc._jsc.sc().makeRDD(scala.asScala(pairs).toSeq(), tag).toJavaRDD(), sc, serializer
    )
    results: list[R] = rdd.flatMap(_frozen_first(run)).collect()
    return results


def _frozen_first(run: Callable[[T], Iterable[R]]) -> Callable[[T], Iterable[R]]:
    def task(item: T) -> Iterable[R]:
        freeze_worker_heap()
        return run(item)

    return task


def each_on_a_thread(fn: Callable[[T], R], items: Sequence[T], name: str) -> list[R]:
    """`[fn(item) for item in items]`, each call on a thread of its own (one item: on this
    thread), for a task's independent pieces of work that mostly wait on Kafka or S3 or run
    in Arrow, which releases the GIL. The first error is raised once every call has ended."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(len(items), thread_name_prefix=name) as pool:
        futures = [pool.submit(fn, item) for item in items]
    return [future.result() for future in futures]


#: How many modules this process had imported when `freeze_worker_heap` last froze its heap.
_FROZEN_AT_MODULES = 0


def freeze_worker_heap() -> bool:
    """Move what a Spark task's Python worker holds into the garbage collector's permanent
    generation (`gc.freeze`) when modules were imported since the last time; whether this call
    froze. Call it at the start of a task. No effect outside a Spark task.

    PySpark's daemon runs `gc.collect()` after every task of a reused Python worker, and a full
    collection walks every object the process tracks: tens of milliseconds for the modules of
    pyspark, pyarrow, numpy and confluent-kafka alone, paid by every task, and by the
    collections Python starts itself as a long-lived worker allocates. Frozen objects are
    skipped by all of them. Modules are what a worker accumulates for its whole life, and a
    task's code imports some only as it runs, so a task freezes again while the count of
    imported modules grows; once the worker has run each kind of task, no task freezes.
    What is frozen is what the worker held after the daemon's last collection: modules,
    their functions and caches, and whatever a task keeps between tasks. The cost: a frozen
    object that later becomes part of an unreachable reference cycle is never freed
    (reference counting still frees every other object).
    """
    global _FROZEN_AT_MODULES
    if len(sys.modules) == _FROZEN_AT_MODULES:
        return False
    from pyspark import TaskContext

    if TaskContext.get() is None:
        return False
    gc.freeze()
    _FROZEN_AT_MODULES = len(sys.modules)
    return True


def trim_worker_path() -> int:
    """Drop the zip/jar entries PySpark puts on a Python worker's `sys.path`; how many.

    Before every task the PySpark worker calls `importlib.invalidate_caches()`, and CPython's
    `zipimporter.invalidate_caches` re-reads the central directory of every zip on the path:
    for a pip-installed PySpark that is `pyspark.zip`, the py4j zip and the spark-core jar
    (thousands of entries), a cost every task pays before it runs. Modules already imported
    from those zips keep working (their packages' `__path__` still points into the zip); call
    it from a task, once the modules it needs are imported (a worker's first task does:
    `mvsink.upstream.publish.publish_worker`), never at import. No effect outside a Spark
    worker.
    """
    import zipimport

    zips = [p for p in sys.path if p.endswith((".zip", ".jar")) and f"{os.sep}pyspark{os.sep}" in p]
    for path in zips:
        sys.path.remove(path)
    for key in [
        k
        for k, v in sys.path_importer_cache.items()
        if isinstance(v, zipimport.zipimporter) and k.startswith(tuple(zips))
    ]:
        del sys.path_importer_cache[key]
    return len(zips)


def write_parquet_parts(
    df: DataFrame, settings: S3Settings, prefix: str
) -> list[tuple[str, int, int]]:
    """Write each Spark partition of `df` as one Parquet object under `prefix/`, from the
    executors; the `(key, rows, bytes)` of each object written (empty partitions write none)."""

    def write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from mvsink.io.s3 import put_bytes, s3_client

        table = pa.Table.from_batches(list(batches))
        if table.num_rows == 0:
            return
        buf = io.BytesIO()
        pq.write_table(table, buf)
        data = buf.getvalue()
        key = f"{prefix}/{uuid.uuid4()}.parquet"
        put_bytes(s3_client(settings), settings.bucket, key, data, "application/vnd.apache.parquet")
        yield pa.RecordBatch.from_pydict(
            {"key": [key], "rows": [table.num_rows], "bytes": [len(data)]},
            schema=pa.schema([("key", pa.string()), ("rows", pa.int64()), ("bytes", pa.int64())]),
        )

    rows = df.mapInArrow(write, PART_RESULT_SCHEMA).collect()
    return [(r["key"], r["rows"], r["bytes"]) for r in rows]


def map_objects(
    spark: SparkSession,
    settings: S3Settings,
    keys: list[str],
    load: Callable[[bytes], pa.Table],
    schema: str | StructType,
) -> DataFrame:
    """A DataFrame of the rows `load` makes of each object in `keys`, fetched and loaded by
    the executors (one task per object, at most 64 tasks); `schema` is the rows' Spark schema.
    `load` runs on executors: it must be picklable (a module-level function or a closure over
    picklable values)."""

    def read(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from mvsink.io.s3 import get_bytes, s3_client

        client = s3_client(settings)
        for batch in batches:
            for key in batch.column("key").to_pylist():
                yield from load(get_bytes(client, settings.bucket, key)).to_batches()

    if not keys:
        return spark.createDataFrame([], schema)
    keys_df = spark.createDataFrame([(k,) for k in keys], "key string")
    return keys_df.repartition(min(len(keys), 64)).mapInArrow(read, schema)


def _read_parquet(data: bytes) -> pa.Table:
    return pq.read_table(io.BytesIO(data))


def read_parquet_parts(
    spark: SparkSession, settings: S3Settings, keys: list[str], schema: str
) -> DataFrame:
    """A DataFrame of the rows of the Parquet objects `keys`, read by the executors (one task
    per object); `schema` is the Spark DDL of the rows."""
    return map_objects(spark, settings, keys, _read_parquet, schema)


def archive_classes(archive: Path) -> None:
    """Start a local session of this module's settings whose JVM writes its classes to
    `archive` as it exits (`mvsink.io.spark_classes`), run the kinds of work mvsink's drivers
    do (an RDD job through a Python worker, SQL with a shuffle, Arrow both ways), and wait for
    the JVM to exit."""
    options = f"-XX:ArchiveClassesAtExit={archive} -Xlog:cds*=off"
    session = spark_session(
        "mvsink-class-archive",
        "local[2]",
        conf={"spark.driver.extraJavaOptions": options},
        archive=False,
    )
    context = session.sparkContext
    assert context.parallelize(range(100), 2).map(lambda x: x * 2).sum() == 9900
    frame = session.createDataFrame(pa.table({"k": [1, 2, 3], "v": ["a", "b", "c"]}))
    assert frame.groupBy("k").count().toArrow().num_rows == 3

    def same(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from batches

    assert frame.mapInArrow(same, frame.schema).count() == 3
    session.range(1000).selectExpr("id % 7 AS k").groupBy("k").count().collect()
    # The JVM writes the archive as it exits, which it does when its stdin closes: wait for it.
    jvm: Any = getattr(context._gateway, "proc")  # noqa: B009 (a private attribute)
    session.stop()
    jvm.stdin.close()
    jvm.wait(600)


if __name__ == "__main__":
    if sys.argv[1:2] != ["--archive-classes"] or len(sys.argv) != 3:
        sys.exit("usage: python -m mvsink.io.spark --archive-classes PATH")
    archive_classes(Path(sys.argv[2]))
