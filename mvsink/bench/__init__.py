"""Benchmarks: measured figures printed next to a baseline from the same run (ratios, not
absolute times, are what to compare on noisy machines)."""

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
