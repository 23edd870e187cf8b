"""mvsink: a self-correcting materialized-view sink on Kafka + Spark + object storage.

The library, by concern, each package built only on those below it (checked by the
import-linter contracts in pyproject.toml):

    cli            the `mvsink` command
    bench          benchmarks: mvsink against its peers, faults, soaks
    tools          what an operator runs: demos, provisioning, inspection, compose
    upstream       producing and decoding the desired collection
    stack          the embedded Kafka / MinIO / Spark / Toxiproxy, and its endpoints injected
                   into the configuration
    shard          the shard: staged parts, the state log, compaction, garbage collection
    io             configuration, Kafka, S3, Spark, the service runtime
    core           frontiers, records and codecs, updates, rows, partitioning, settings

The services (`services.mint`, `services.write`, `services.append`, `services.ct`) are built on
the library; the library never imports them.
"""

import os
from collections.abc import Callable

__version__ = "0.1.0"


def _choose_arrow_memory_pool() -> None:
    """Arrow allocates with jemalloc in every process that imports mvsink and, through the
    environment, in what it starts (Spark's JVM and its Python workers, the services), unless
    `ARROW_DEFAULT_MEMORY_POOL` already names a pool or this build of pyarrow lacks jemalloc.

    pyarrow's default, mimalloc, is as fast for one thread, not when several threads of a
    process decode and encode at once, as a write task's partitions do (docs/decisions.md,
    "Arrow allocates with jemalloc"). The variable reaches processes started later;
    `set_memory_pool` covers this one, even if pyarrow was imported and used before mvsink."""
    if "ARROW_DEFAULT_MEMORY_POOL" in os.environ:
        return
    import pyarrow as pa

    if "jemalloc" not in pa.supported_memory_backends():
        return
    os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "jemalloc"
    pa.set_memory_pool(pa.jemalloc_memory_pool())


_choose_arrow_memory_pool()

#: Progress output for long work (builds, starts, demo ticks): called with one line at a time.
Say = Callable[[str], None]
