"""mvsink: a self-correcting materialized-view sink on Kafka + Spark + object storage.

The library, by concern, each package built only on those below it (checked by the
import-linter contracts in pyproject.toml):

    cli            the `mvsink` command
    bench          benchmarks: mvsink against its peers, faults, soaks
    tools          what an operator runs: demos, provisioning, inspection, compose
    upstream       producing and decoding the desired collection
    shard          the shard: staged parts, the state log, compaction, garbage collection
    io             configuration, Kafka, S3, Spark, the service runtime
    stack          the embedded Kafka / MinIO / Spark / Toxiproxy
    core           frontiers, records and codecs, updates, rows, partitioning, settings

The services (`services.mint`, `services.write`, `services.append`, `services.ct`) are built on
the library; the library never imports them.
"""

from collections.abc import Callable

__version__ = "0.1.0"

#: Progress output for long work (builds, starts, demo ticks): called with one line at a time.
Say = Callable[[str], None]
