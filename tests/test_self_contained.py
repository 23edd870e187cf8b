"""A clone is the whole product: nothing under the repository refers to a path outside it (the
reference material that sat beside the repository while it was built, a developer's machine),
and every relative link of its Markdown resolves to a file inside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from mvsink.io.config import REPO_ROOT

#: Written in pieces so that this file does not match itself.
FORBIDDEN = (
    "../" + "shared",
    "shared/" + "vendor",
    "shared/" + "seeds",
    "shared/" + "DESIGN",
    "DESIGN" + ".md",
    "DESIGN" + " §",
    "REPO_ROOT" + ".parent",
    "/" + "work/",
)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
#: Never scanned: what git ignores, and binary data.
_BINARY = (".png", ".jpg", ".parquet", ".jar", ".whl", ".zip", ".gz")


def tracked_files(root: Path) -> list[Path]:
    """The files of the repository: git's list of tracked and not-ignored files."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    return [root / name for name in listed.decode().split("\0") if name]


def outside_references(root: Path, files: list[Path]) -> list[str]:
    """`file:line: what` for every reference out of `root` in `files`."""
    found = []
    for path in files:
        if path.suffix in _BINARY or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        name = path.relative_to(root)
        for number, line in enumerate(text.splitlines(), 1):
            found += [f"{name}:{number}: {bad!r}" for bad in FORBIDDEN if bad in line]
            if path.suffix != ".md":
                continue
            for target in _LINK.findall(line):
                if re.match(r"^[a-z]+:|^#", target):  # a URL or an anchor of the same page
                    continue
                resolved = (path.parent / target.split("#")[0]).resolve()
                if not resolved.is_relative_to(root.resolve()):
                    found.append(f"{name}:{number}: link {target!r} leaves the repository")
                elif not resolved.exists():
                    found.append(f"{name}:{number}: link {target!r} points at nothing")
    return found


def test_nothing_in_the_repository_refers_outside_it() -> None:
    files = tracked_files(REPO_ROOT)
    assert len(files) > 50
    assert outside_references(REPO_ROOT, files) == []


def test_the_check_finds_references_out_of_the_repository(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "here.md").write_text("fine\n")
    (root / "README.md").write_text(
        "[ok](docs/here.md) [up](../" + "shared/x.md) [gone](docs/none.md) [web](https://x.y/)\n"
    )
    (root / "tool.py").write_text("SPEC = REPO_ROOT" + ".parent / 'x'\n")
    found = outside_references(root, [root / "README.md", root / "tool.py", root / "docs/here.md"])
    assert found == [
        "README.md:1: '../" + "shared'",
        "README.md:1: link '../" + "shared/x.md' leaves the repository",
        "README.md:1: link 'docs/none.md' points at nothing",
        "tool.py:1: 'REPO_ROOT" + ".parent'",
    ]
