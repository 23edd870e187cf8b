"""Jars from Maven Central: one resolver for everything mvsink runs on the JVM.

`resolve` runs `mvn dependency:copy-dependencies` on one of the POMs in `maven/` with
`maven/settings.xml` (every repository mirrored to Central) into a cache directory, once: a
marker file records a complete resolution, so a rerun costs nothing and an interrupted one
starts over.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mvsink.core.errors import StackError
from mvsink.stack import procs

MAVEN = Path(__file__).resolve().parent / "maven"
SETTINGS = MAVEN / "settings.xml"


def resolve(pom: str, libs: Path, say: procs.Say, what: str, options: Sequence[str] = ()) -> Path:
    """The directory `libs` holding the runtime jars of `maven/<pom>`, resolving them first if
    it is not complete yet. `options` are extra `-D` settings (versions, artifact filters)."""
    libs = libs.resolve()  # Maven resolves relative paths against the POM's directory
    marker = libs.parent / f"{libs.name}.complete"
    if marker.exists():
        return libs
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
    marker.write_text(" ".join(options))
    return libs
