"""Spark's classes archived once for every driver JVM this machine starts (JDK application
class-data sharing, AppCDS).

A Spark driver loads and verifies some ten thousand classes from its jars before its first
query runs: on a 2-core box that is most of a session's start and of its first SQL job. A
dynamic CDS archive (`-XX:ArchiveClassesAtExit`, JDK 13+) holds those classes parsed and
verified; a JVM started with `-XX:SharedArchiveFile` maps it instead of loading them again.

* **Built once** per JDK and Spark installation by `python -m mvsink.io.spark_classes`
  (`./run setup` runs it): a throwaway session of `spark_session`'s own settings runs the kinds
  of work mvsink's drivers do (`mvsink.io.spark.archive_classes`) and the JVM writes the
  archive as it exits. Written aside and renamed into place, so no JVM maps a
  half-written one; two builders racing both write whole archives and the last rename wins.
* **Used** by `mvsink.io.spark.spark_session` when the archive of this JDK and Spark is in the
  cache (`cache_dir()/spark-classes/`); without it a session starts as before. The JVM checks
  the archive against itself and its class path (jar sizes and times) and ignores one that does
  not match (`-Xshare:auto`, the default), so a stale archive costs its benefit, never a start.
* Only the driver's JVM: executors on a cluster start from their worker's class path, and
  `spark-submit`'s short launcher JVM loads few classes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

#: The JVM options that map an archive; `{}` is its path. CDS's own log lines (a class it
#: skips, a mismatch it ignores) stay out of the services' logs.
USE = "-XX:SharedArchiveFile={} -Xlog:cds*=off -Xlog:class+path=off"
#: How long one build may take before it is abandoned.
BUILD_TIMEOUT_S = 600


def _java() -> Path | None:
    """The `java` a driver runs: `$JAVA_HOME/bin/java` (as `spark-submit` picks it), else the
    one on the path."""
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else None
    if found is None or not found.exists():
        which = shutil.which("java")
        found = Path(which) if which else None
    return found.resolve() if found is not None else None


def archive_path(cache: Path) -> Path | None:
    """Where this machine's archive for this JDK and Spark installation lives under `cache`;
    None without a `java`. Keyed by the JDK binary and Spark's jars (their paths, sizes and
    times, as the JVM checks them)."""
    import pyspark

    java = _java()
    if java is None:
        return None
    jars = Path(pyspark.__file__).parent / "jars"
    key = hashlib.sha256(f"{java}:{java.stat().st_mtime_ns}".encode())
    for jar in sorted(jars.glob("*.jar")):
        stat = jar.stat()
        key.update(f"{jar}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return cache / "spark-classes" / f"{key.hexdigest()[:16]}.jsa"


def driver_options(cache: Path) -> str:
    """The driver JVM options that map this machine's archive, or "" when it is not built."""
    path = archive_path(cache)
    return USE.format(path) if path is not None and path.is_file() else ""


def merged(conf: Mapping[str, str], options: str) -> dict[str, str]:
    """`conf` with `options` appended to `spark.driver.extraJavaOptions`."""
    out = dict(conf)
    if options:
        key = "spark.driver.extraJavaOptions"
        out[key] = f"{out[key]} {options}" if out.get(key) else options
    return out


def build(cache: Path, say: Callable[[str], None] = print) -> Path | None:
    """Build the archive for this JDK and Spark into `cache` unless it is there; its path (None
    without a `java`). Raises `RuntimeError` naming the log when the build fails."""
    path = archive_path(cache)
    if path is None or path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_suffix(f".{os.getpid()}.part")
    log = path.with_suffix(".log")
    say(f"building Spark's class archive {path.name} (once per JDK and Spark; about a minute)")
    started = time.monotonic()
    with log.open("wb") as out:
        done = subprocess.run(
            [sys.executable, "-m", "mvsink.io.spark", "--archive-classes", str(aside)],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=BUILD_TIMEOUT_S,
        )
    if done.returncode != 0 or not aside.is_file():
        aside.unlink(missing_ok=True)
        raise RuntimeError(f"building Spark's class archive failed (exit {done.returncode}): {log}")
    os.replace(aside, path)
    say(
        f"built {path} ({path.stat().st_size / 2**20:.0f} MiB) in {time.monotonic() - started:.0f}s"
    )
    return path


def main(argv: list[str]) -> int:
    """`python -m mvsink.io.spark_classes`: build the archive unless it is there."""
    from mvsink.io.config import cache_dir

    def say(message: str) -> None:
        print(f"spark-classes: {message}", file=sys.stderr, flush=True)

    try:
        found = build(cache_dir(), say)
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        say(f"error: {error}")
        return 1
    if found is None:
        say("no java found: nothing to archive")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
