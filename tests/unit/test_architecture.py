"""The architecture as a checked contract: the import-linter contracts of pyproject.toml (the
library's layers, the library never importing the services, the services independent of each
other, no I/O in the core and the state machines, no import circles)."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_import_contracts_hold() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "lint-imports is missing: install the dev extras (./run setup)"
    done = subprocess.run(
        [lint, "--config", "pyproject.toml", "--no-cache"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout, done.stdout[-4000:]
