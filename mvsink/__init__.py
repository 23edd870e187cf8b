"""mvsink: a self-correcting materialized-view sink on Kafka + Spark + object storage.

Core package: frontiers, the record contracts and their codecs, configuration, Kafka and S3
helpers, the Spark session factory, and the embedded stack.
"""

from collections.abc import Callable

__version__ = "0.1.0"

#: Progress output for long work (builds, starts, demo ticks): called with one line at a time.
Say = Callable[[str], None]
