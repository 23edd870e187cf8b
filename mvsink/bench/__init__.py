"""Benchmarks: measured figures printed next to a baseline from the same run (ratios, not
absolute times, are what to compare on noisy machines).

The benchmarks are an optional extra of the library (`pip install 'mvsink[bench]'`: the charts'
matplotlib); `require_extra` stops a benchmark at once, naming it, where the extra is missing.
"""

import importlib.util

from mvsink.core.errors import MvsinkError

#: The distributions of the `bench` extra (pyproject.toml), by the module each one provides.
EXTRA = {"matplotlib": "matplotlib"}

#: The faults of `mvsink bench faults` (`mvsink.bench.faults`), in their default order; here so
#: the CLI lists them without importing the benchmark.
FAULTS = (
    "kafka-kill",
    "minio-kill",
    "kafka-stop",
    "minio-stop",
    "minio-slow",
    "mint-kill",
    "write-kill",
    "append-kill",
    "mint-pause",
    "write-pause",
    "append-pause",
)
#: The fault matrix's default shard `min_grace` (seconds; `mvsink.bench.faults.grace_bounds`).
FAULTS_MIN_GRACE = 30.0


def require_extra() -> None:
    """Return if the `bench` extra is installed.

    Raises:
        MvsinkError: naming the missing distributions and `pip install 'mvsink[bench]'`.
    """
    missing = sorted(dist for module, dist in EXTRA.items() if not importlib.util.find_spec(module))
    if missing:
        raise MvsinkError(
            f"the benchmarks need the bench extra ({', '.join(missing)} not installed): "
            "pip install 'mvsink[bench]'"
        )
