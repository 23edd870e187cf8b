"""write: on Spark, keeps `corrections = desired - persist` per desired partition and stages
Parquet correction batches for each batch description, reporting them on `<sink>.batches`
(port of the seed's `write` operator and `Correction` buffer; see DESIGN §4).

The operator lands with issue #5; until then `python -m services.write` validates its
configuration and exits 3.
"""
