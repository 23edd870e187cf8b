"""Processes sharing the download/build cache (the suite's workers, two commands of one clone)
fill an entry once, and none of them sees it half-filled (`mvsink.stack.procs.filling`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: A `go` that counts its runs and writes the binary slowly, in two steps: a reader that found
#: the file while it is written would see only its first half.
FAKE_GO = """#!/bin/sh
echo run >> "$RUNS"
printf 'half' > "$GOBIN/tool"
sleep 1
printf ' and whole' >> "$GOBIN/tool"
"""

#: One process: the path `go_install` returns, and the file's content when it returned.
INSTALL = """
import sys
from pathlib import Path
from mvsink.stack.procs import go_install
path = go_install("example.com/tool", "v1", "tool", Path(sys.argv[1]), lambda m: None, "tool")
print(path.read_text())
"""


def _fake_go(tmp_path: Path, script: str) -> dict[str, str]:
    """The environment of a process whose `go` is `script` (its runs counted in `runs`)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    go = bin_dir / "go"
    go.write_text(script)
    go.chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", RUNS=str(tmp_path / "runs"))


def _install(cache: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", INSTALL, str(cache)], env=env, capture_output=True, text=True
    )


def test_racing_installs_build_once_and_return_the_whole_binary(tmp_path: Path) -> None:
    env, cache = _fake_go(tmp_path, FAKE_GO), tmp_path / "cache"
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", INSTALL, str(cache)], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    outputs = [racer.communicate(timeout=60)[0].strip() for racer in racers]
    assert [racer.returncode for racer in racers] == [0] * 4
    assert outputs == ["half and whole"] * 4
    assert (tmp_path / "runs").read_text().split() == ["run"]  # built once
    assert sorted(p.name for p in cache.iterdir()) == [".tool.lock", "go-install.log", "tool"]


def test_a_failed_build_leaves_no_binary_and_the_next_one_builds(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    failed = _install(
        cache, _fake_go(tmp_path, "#!/bin/sh\nprintf 'half' > \"$GOBIN/tool\"\nexit 1\n")
    )
    assert failed.returncode != 0
    assert "building tool with go install" in failed.stderr
    assert not (cache / "tool").exists()  # the half-written file never reached the cache
    built = _install(cache, _fake_go(tmp_path, FAKE_GO))
    assert built.returncode == 0, built.stderr
    assert built.stdout.strip() == "half and whole"
