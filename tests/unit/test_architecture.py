"""The architecture as a checked contract: the import-linter contracts of pyproject.toml (the
library's layers, the embedded stack above the configuration, the library never importing the
services, the services independent of each other, no I/O in the core and the state machines,
the write service's driver side over its executor side over its pure modules, which do no I/O,
no import circles)."""

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


def test_the_layers_put_the_stack_above_io_and_order_the_write_service() -> None:
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"
    ]
    layers = {tuple(c["containers"]): c["layers"] for c in contracts if c["type"] == "layers"}
    library = [layer.split(" | ") for layer in layers[("mvsink",)]]
    stack = next(i for i, layer in enumerate(library) if "stack" in layer)
    assert stack < library.index(["io"])  # listed first: above
    write = layers[("services.write",)]
    executor_side = write.index("task")
    assert all(write.index(m) < executor_side for m in ("shell", "compactor | repair | resident"))
