"""mvsink: a self-correcting materialized-view sink on Kafka + Spark + object storage.

Core package: frontiers, the record contracts and their codecs, configuration, Kafka and S3
helpers, the Spark session factory, and the embedded stack.
"""

__version__ = "0.1.0"
