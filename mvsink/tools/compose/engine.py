"""What `docker compose` needs on this machine: a Docker engine, the compose v2 plugin, the
Debian base image, and the project's images built from `docker-compose.yaml`.

Each `ensure_*` returns at once when the thing is there, and otherwise provides it where it
can, or raises `StackError` saying what to install:

* `ensure_engine`: a Docker CLI whose daemon answers. As root with apt, installs Debian's
  `docker.io` if `dockerd` is missing and starts `dockerd` in the background (log in the state
  directory); it keeps running after this process, like a system service.
* `ensure_compose`: the compose v2 plugin. Debian bookworm packages only compose 1, and
  `go install` refuses compose v2's module (its go.mod has `exclude` directives), so it is built
  from the module's source as the Go module proxy serves it (`go mod download`, then `go build
  ./cmd` in a copy), cached, and installed as `~/.docker/cli-plugins/docker-compose`.
* `ensure_base`: `debian:bookworm-slim`. Pulled where a registry answers; otherwise made with
  `debootstrap --variant=minbase bookworm` and trimmed as the official slim image is (no docs,
  man pages or locales, nor downloaded packages, now or in later `apt-get install`s), then
  `docker import`ed under that name, so the Dockerfiles build unchanged.
* `build_env`: the environment for `docker compose build`: `MVSINK_BUILD_CA`, the certificates
  this machine trusts beyond Debian's (`/usr/local/share/ca-certificates`), which the build
  stages need behind a TLS-intercepting proxy (`docker/trust-build-ca`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from mvsink import Say
from mvsink.core.errors import StackError
from mvsink.io.config import REPO_ROOT
from mvsink.stack import procs

COMPOSE_MODULE = "github.com/docker/compose/v2"
COMPOSE_VERSION = "v2.40.3"
BASE_IMAGE = "debian:bookworm-slim"
COMPOSE_FILE = REPO_ROOT / "docker-compose.yaml"
EXTRA_CA_DIR = Path("/usr/local/share/ca-certificates")
#: What the official slim image leaves out, for every package installed later too.
SLIM_EXCLUDES = (
    "path-exclude /usr/share/doc/*\n"
    "path-include /usr/share/doc/*/copyright\n"
    "path-exclude /usr/share/man/*\n"
    "path-exclude /usr/share/info/*\n"
    "path-exclude /usr/share/locale/*\n"
    "path-include /usr/share/locale/locale.alias\n"
)
#: As the official image: downloaded packages are deleted after every install, so no layer
#: keeps them.
APT_CLEAN = (
    'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb '
    '/var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };\n'
    'APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb '
    '/var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };\n'
    'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n'
)
#: Debian's own suites, as the official image lists them; `{uri}` is the mirror debootstrap used.
SOURCES = (
    "Types: deb\n"
    "URIs: {uri}\n"
    "Suites: bookworm bookworm-updates\n"
    "Components: main\n"
    "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
    "Types: deb\n"
    "URIs: {uri}-security\n"
    "Suites: bookworm-security\n"
    "Components: main\n"
    "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
)


def docker(
    *args: str, timeout: float = 60.0, check: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`docker ARGS`, its output captured as text; with `check`, a failure raises `StackError`
    carrying that output."""
    result = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    if check and result.returncode != 0:
        raise StackError(
            f"`docker {' '.join(args)[:200]}` failed (exit {result.returncode}):\n"
            f"{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    return result


def docker_answers() -> bool:
    """Whether a Docker CLI is installed and its daemon answers."""
    if shutil.which("docker") is None:
        return False
    try:
        return docker("version", "--format", "{{.Server.Version}}", timeout=15).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def compose_answers() -> bool:
    """Whether `docker compose` (v2) runs."""
    if shutil.which("docker") is None:
        return False
    try:
        return docker("compose", "version", timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _apt_install(packages: Sequence[str], log: Path, say: Say, why: str) -> None:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise StackError(
            f"{why}: install {' '.join(packages)} (Docker Engine: "
            "https://docs.docker.com/engine/install/), or run as root on Debian"
        )
    say(f"{why}: apt-get install {' '.join(packages)} ...")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    procs.run_checked(["apt-get", "update", "-q"], log=log, env=env, what="apt-get update")
    procs.run_checked(
        ["apt-get", "install", "-y", "-q", *packages],
        log=log,
        env=env,
        what=f"apt-get install {' '.join(packages)}",
    )


def ensure_engine(home: Path, say: Say, timeout: float = 90.0) -> None:
    """A Docker daemon that answers (module docs)."""
    if docker_answers():
        return
    if shutil.which("dockerd") is None or shutil.which("docker") is None:
        _apt_install(["docker.io"], home / "apt.log", say, "no Docker engine")
    log = home / "dockerd.log"
    say(f"starting dockerd in the background (log {log}) ...")
    pid = procs.spawn(["dockerd"], log=log, env=os.environ, cwd=home)
    procs.wait_ready("dockerd", docker_answers, pid=pid, log=log, timeout=timeout)


def ensure_compose(cache: Path, say: Say) -> None:
    """The compose v2 CLI plugin (module docs)."""
    if compose_answers():
        return
    built = cache / "compose" / COMPOSE_VERSION / "docker-compose"
    if not built.exists():
        go = procs.require_tool("go", "install Go >= 1.24, or the docker compose v2 plugin")
        say(
            f"building docker compose {COMPOSE_VERSION} from its Go module (first run only; "
            "about 3 minutes on 2 cores) ..."
        )
        log = built.parent / "build.log"
        built.parent.mkdir(parents=True, exist_ok=True)
        module = subprocess.run(
            [go, "mod", "download", "-json", f"{COMPOSE_MODULE}@{COMPOSE_VERSION}"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if module.returncode != 0:
            raise StackError(
                f"go mod download {COMPOSE_MODULE}@{COMPOSE_VERSION} failed:\n"
                f"{module.stdout}{module.stderr}"
            )
        source = Path(json.loads(module.stdout)["Dir"])
        with tempfile.TemporaryDirectory(dir=built.parent) as work:
            tree = Path(work) / "src"
            shutil.copytree(source, tree)
            for path in [tree, *tree.rglob("*")]:  # the module cache is read-only
                path.chmod(path.stat().st_mode | 0o200)
            flags = f"-s -w -X {COMPOSE_MODULE}/internal.Version={COMPOSE_VERSION}"
            env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-buildvcs=false")
            procs.run_checked(
                [go, "build", "-trimpath", "-ldflags", flags, "-o", f"{built}.tmp", "./cmd"],
                log=log,
                env=env,
                what="building docker compose",
                cwd=tree,
            )
        Path(f"{built}.tmp").rename(built)
    plugins = Path.home() / ".docker" / "cli-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    shutil.copy2(built, plugins / "docker-compose")
    say(f"installed {plugins / 'docker-compose'}")
    if not compose_answers():
        raise StackError("docker compose still does not run after installing the plugin")


def image_exists(name: str) -> bool:
    """Whether the engine has image `name`."""
    return docker("image", "inspect", name).returncode == 0


def ensure_base(home: Path, say: Say) -> None:
    """`debian:bookworm-slim`, pulled or made (module docs)."""
    if image_exists(BASE_IMAGE):
        return
    pulled = docker("pull", BASE_IMAGE, timeout=600)
    if pulled.returncode == 0:
        return
    why = (pulled.stderr.strip().splitlines() or ["no reason given"])[-1]
    say(f"{BASE_IMAGE} cannot be pulled ({why}); making it with debootstrap ...")
    log = home / "debootstrap.log"
    if shutil.which("debootstrap") is None:
        _apt_install(["debootstrap"], home / "apt.log", say, "making the base image")
    with tempfile.TemporaryDirectory(dir=home) as work:
        root = Path(work) / "rootfs"
        procs.run_checked(
            ["debootstrap", "--variant=minbase", "bookworm", str(root)], log=log, what="debootstrap"
        )
        _slim(root)
        _import(root, log)


def _import(root: Path, log: Path) -> None:
    """`tar -C root -c . | docker import - BASE_IMAGE`, failing if either side fails."""
    with log.open("ab") as out:
        tar = subprocess.Popen(
            ["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE, stderr=out
        )
        imported = subprocess.run(
            ["docker", "import", "-c", 'CMD ["bash"]', "-", BASE_IMAGE],
            stdin=tar.stdout,
            stdout=out,
            stderr=out,
        )
        assert tar.stdout is not None
        tar.stdout.close()
        tar_exit = tar.wait()
    if tar_exit != 0 or imported.returncode != 0:
        if imported.returncode == 0:  # a partial tree must not pass for the base image
            docker("image", "rm", BASE_IMAGE)
        raise StackError(
            f"importing {root} as {BASE_IMAGE} failed (tar exit {tar_exit}, "
            f"docker import exit {imported.returncode}); log {log}:\n"
            f"{procs.log_tail(log)}"
        )


def _slim(root: Path) -> None:
    """Trim a debootstrapped tree as the official slim image is, and set Debian's suites."""
    for pattern in (
        "var/cache/apt/archives/*.deb",
        "var/lib/apt/lists/*",
        "usr/share/man/*",
        "usr/share/info/*",
        "var/log/*.log",
        "var/log/apt/*",
    ):
        for path in root.glob(pattern):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    for doc in (root / "usr/share/doc").glob("*"):
        for path in doc.rglob("*"):
            if path.is_file() and path.name != "copyright":
                path.unlink()
    for path in (root / "usr/share/locale").glob("*"):
        if path.name != "locale.alias":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    (root / "etc/dpkg/dpkg.cfg.d/docker-slim").write_text(SLIM_EXCLUDES)
    (root / "etc/apt/apt.conf.d/docker-clean").write_text(APT_CLEAN)
    (root / "etc/apt/apt.conf.d/docker-no-languages").write_text('Acquire::Languages "none";\n')
    listed = (root / "etc/apt/sources.list").read_text().split()  # deb URI bookworm main
    (root / "etc/apt/sources.list").unlink()
    uri = listed[listed.index("deb") + 1].rstrip("/")
    (root / "etc/apt/sources.list.d/debian.sources").write_text(SOURCES.format(uri=uri))


def build_env() -> dict[str, str]:
    """The environment for `docker compose build` (module docs)."""
    pems = sorted(EXTRA_CA_DIR.glob("*.crt")) if EXTRA_CA_DIR.is_dir() else []
    bundle = "".join(p.read_text() for p in pems)
    return {**os.environ, "MVSINK_BUILD_CA": bundle} if bundle else dict(os.environ)


def compose(
    args: Sequence[str],
    *,
    project: str,
    env: dict[str, str] | None = None,
    timeout: float = 600.0,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """`docker compose -f docker-compose.yaml -p project ARGS` (`docker`)."""
    return docker(
        "compose",
        "-f",
        str(COMPOSE_FILE),
        "-p",
        project,
        *args,
        timeout=timeout,
        check=check,
        env=env,
    )


def ensure_images(services: Sequence[str], home: Path, cache: Path, say: Say) -> float:
    """Build the images of `services` (all when empty) with `docker compose build`, after the
    engine, the compose plugin and the base image (logs under `home`, builds cached in
    `cache`); the seconds the build took."""
    ensure_engine(home, say)
    ensure_compose(cache, say)
    ensure_base(home, say)
    started = time.monotonic()
    say(f"docker compose build {' '.join(services) or '(every image)'} ...")
    env = {**build_env(), "MVSINK_S3_ACCESS_KEY": "build", "MVSINK_S3_SECRET_KEY": "build"}
    compose(["build", *services], project="mvsink-build", env=env, timeout=3600)
    return time.monotonic() - started
