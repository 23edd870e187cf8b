"""Jars from Maven Central: one resolver for everything mvsink runs on the JVM.

`resolve` runs `mvn dependency:copy-dependencies` on one of the POMs in `maven/` with
`maven/settings.xml` (every repository mirrored to Central) into a cache directory, once: a
marker file records a complete resolution, so a rerun costs nothing and an interrupted one
starts over; processes sharing the cache resolve one at a time (`procs.filling`).

`fetch` downloads one file of Central by its path, checked against a pinned SHA-256: for an
artifact Maven cannot resolve because Central lacks its parent POM (the Schema Registry's
distribution, `mvsink.stack.registry`).
"""

from __future__ import annotations

import hashlib
import os
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from mvsink.core.errors import StackError
from mvsink.stack import procs

MAVEN = Path(__file__).resolve().parent / "maven"
SETTINGS = MAVEN / "settings.xml"
#: Maven Central, as `maven/settings.xml` names it.
CENTRAL = "https://repo.maven.apache.org/maven2"


def resolve(pom: str, libs: Path, say: procs.Say, what: str, options: Sequence[str] = ()) -> Path:
    """The directory `libs` holding the runtime jars of `maven/<pom>`, resolving them first if
    it is not complete yet. `options` are extra `-D` settings (versions, artifact filters)."""
    libs = libs.resolve()  # Maven resolves relative paths against the POM's directory
    marker = libs.parent / f"{libs.name}.complete"
    if marker.exists():
        return libs
    with procs.filling(libs):
        if not marker.exists():
            _resolve(pom, libs, say, what, options)
            marker.write_text(" ".join(options))
    return libs


def _resolve(pom: str, libs: Path, say: procs.Say, what: str, options: Sequence[str]) -> None:
    """Copy the runtime jars of `maven/<pom>` into `libs` with Maven (`resolve` holds the lock)."""
    procs.require_tool("java", "install a JDK 17 (e.g. `apt-get install openjdk-17-jre-headless`)")
    mvn = procs.require_tool("mvn", "install Maven (e.g. `apt-get install maven`)")
    say(f"resolving {what} from Maven Central into {libs} ...")
    libs.mkdir(parents=True, exist_ok=True)
    procs.run_checked(
        [
            mvn,
            "-B",
            "-q",
            "-s",
            str(SETTINGS),
            "-f",
            str(MAVEN / pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={libs}",
            "-DincludeScope=runtime",
            *options,
        ],
        log=libs.parent / f"{libs.name}.mvn.log",
        what=f"resolving {what} with Maven",
    )
    if not any(libs.glob("*.jar")):
        raise StackError(f"resolving {what} produced no jars in {libs}")


def fetch(path: str, sha256: str, target: Path, say: procs.Say, what: str) -> Path:
    """`target`, downloaded from `CENTRAL/<path>` if it is not there yet, its SHA-256 checked
    against `sha256` (a mismatch deletes the download and raises `StackError`); progress every
    tenth of the way."""
    if target.exists():
        return target
    url = f"{CENTRAL}/{path}"
    say(f"fetching {what} from Maven Central ({url}) ...")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.part")
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=60) as response, partial.open("wb") as out:
            size, done, shown = int(response.headers.get("Content-Length") or 0), 0, 0
            while chunk := response.read(1 << 20):
                out.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                if size and done * 10 // size > shown:
                    shown = done * 10 // size
                    say(f"  {what}: {done / 2**20:.0f} of {size / 2**20:.0f} MiB")
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise StackError(f"fetching {what} from {url} failed: {error}") from error
    if digest.hexdigest() != sha256:
        partial.unlink(missing_ok=True)
        raise StackError(
            f"{url} has SHA-256 {digest.hexdigest()}, not the pinned {sha256}: not used"
        )
    partial.replace(target)
    return target
