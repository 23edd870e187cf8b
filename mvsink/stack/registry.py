"""Embedded Schema Registry: Apicurio Registry 3 from Maven Central, its Confluent-compatible API
(`/apis/ccompat/v7`) on loopback, storage in memory.

* `ensure_server` fetches the server distribution Apicurio publishes on Maven Central with every
  release (`apicurio-registry-app-<v>-all.tar.gz`: the Quarkus runner jar
  `apicurio-registry-app-<v>-runner.jar` beside its `lib/`), checked against `SHA256`, into the
  cache and unpacks it there, once: a marker records a complete unpacking, so a rerun costs
  nothing and an interrupted one starts over. It is fetched by its path (`jars.fetch`), not
  resolved by Maven: Central lacks the artifact's parent POM (`io.apicurio:apicurio-registry`
  3.0.9), so Maven refuses it. Nor is it a Quarkus build of the app module: Central lacks
  modules that build needs (`apicurio-registry-contracts-rules` in any version, parents such as
  `io.quarkus:quarkus-smallrye-health-parent`).
* `RegistryNode.start` runs `java -jar <runner>` on the `java` that runs Kafka (17+), its one
  listener (the API; this build has no separate management interface) on 127.0.0.1:`port`. It
  is ready when `GET /apis/ccompat/v7/subjects` answers 200 (`registry_ready`).

`APICURIO_VERSION` is the newest 3.x whose classes run on Java 17 (3.1 and later are Java 21
bytecode), so the stack, the compose image (`docker/registry`) and Kafka share one JVM.

Storage is Apicurio's default, H2 in memory: a restart starts empty, like the rest of a test
home. As Confluent's registry, it answers content ids (one id for a schema text, in every
subject), 409 for a schema its subject's level refuses, and Confluent's error codes for unknown
ids and subjects. Where it differs:

* the global compatibility level is NONE (Apicurio's default; Confluent's is BACKWARD) and is
  left so: here a global rule outranks a subject's NONE (a subject may be stricter than the
  global level, never laxer), so only a global NONE lets every subject's own level decide, as
  Confluent's does. mvsink sets the level of every subject it registers (`mvsink.io.registry`);
* a subject matches a schema by its exact text: the same schema reformatted registers a new
  version where Confluent's finds the registered one by its canonical form. mvsink always
  registers the same text.
"""

from __future__ import annotations

import shutil
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from mvsink.core.errors import StackError
from mvsink.stack import jars, procs
from mvsink.stack.component import Component
from mvsink.stack.state import registry_url

APICURIO_VERSION = "3.0.9"
#: The distribution's path on Maven Central, and its SHA-256 (the compose image checks it too).
DISTRIBUTION = (
    f"io/apicurio/apicurio-registry-app/{APICURIO_VERSION}/"
    f"apicurio-registry-app-{APICURIO_VERSION}-all.tar.gz"
)
SHA256 = "2b28181501a20cbf6efcd77f9b7153908fc01f3d3a7c32024c0bd9e1b04c8a43"
#: Server settings (Java system properties, which outrank the distribution's
#: application.properties); the listeners' hosts and ports are added per node.
SETTINGS = {
    # ccompat ids are content ids, as Confluent's: one id per distinct schema, in every subject
    # (legacy mode would answer global ids, one per subject version).
    "apicurio.ccompat.legacy-id-mode.enabled": "false",
    # One log line per HTTP request is noise in a stack log.
    "quarkus.http.access-log.enabled": "false",
    "quarkus.otel.sdk.disabled": "true",
}


def runner_name(version: str = APICURIO_VERSION) -> str:
    """The file name of the distribution's runner jar."""
    return f"apicurio-registry-app-{version}-runner.jar"


def ensure_server(cache: Path, say: procs.Say) -> Path:
    """The server's runner jar (its `lib/` beside it), fetched and unpacked into the cache if not
    there yet."""
    root = (cache / "registry" / APICURIO_VERSION).resolve()
    app = root / "app"
    marker = root / "app.complete"
    runner = app / runner_name()
    if marker.exists():
        return runner
    with procs.filling(app):
        if marker.exists():
            return runner
        tarball = jars.fetch(
            DISTRIBUTION,
            SHA256,
            root / Path(DISTRIBUTION).name,
            say,
            f"Apicurio Registry {APICURIO_VERSION}",
        )
        unpacked = root / "unpacked"
        shutil.rmtree(unpacked, ignore_errors=True)
        with tarfile.open(tarball) as tar:
            tar.extractall(unpacked, filter="data")
        found = next(unpacked.rglob(runner.name), None)
        if found is None:
            raise StackError(f"{tarball} has no {runner.name}")
        shutil.rmtree(app, ignore_errors=True)
        found.parent.replace(app)
        shutil.rmtree(unpacked, ignore_errors=True)
        tarball.unlink()
        marker.write_text(f"{APICURIO_VERSION}\n")
    return runner


@dataclass
class RegistryNode(Component):
    """One Apicurio Registry: the Confluent-compatible API at `url` (`port`)."""

    LOG = "registry.log"

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL: what `schema_registry_url` takes."""
        return registry_url(self.address)

    def start(self, runner: Path, say: procs.Say) -> int:
        """Launch the server's `runner` jar (`ensure_server`); its pid (not yet ready)."""
        java = procs.java()
        work = self.home / "work"  # snapshot and import scratch space (Apicurio: /tmp)
        work.mkdir(parents=True, exist_ok=True)
        settings = {
            **SETTINGS,
            "quarkus.http.host": procs.LOOPBACK,
            "quarkus.http.port": str(self.port),
            "apicurio.storage.snapshot.location": str(work),
            "apicurio.import.work-dir": str(work),
        }
        say(f"starting Schema Registry (Apicurio {APICURIO_VERSION}) on {self.url} ...")
        return procs.spawn(
            [
                java,
                "-Xms64m",
                "-Xmx384m",
                "-XX:+UseSerialGC",
                "-Djava.awt.headless=true",
                f"-Djava.io.tmpdir={work}",
                *(f"-D{key}={value}" for key, value in settings.items()),
                "-jar",
                str(runner),
            ],
            log=self.log,
            env=procs.base_env(),
            cwd=self.home,
        )

    def ready(self) -> bool:
        """Whether the registry serves (`registry_ready`)."""
        return registry_ready(self.url)


def registry_ready(url: str) -> bool:
    """Whether the registry at `url` (`registry_url`) lists its subjects."""
    with urllib.request.urlopen(f"{url}/subjects", timeout=2) as response:
        return bool(response.status == 200)
