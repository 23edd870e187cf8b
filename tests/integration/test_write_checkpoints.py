"""Write-task checkpoints in real MinIO: Arrow IPC now, Parquet ones from before still load and
are removed once an Arrow checkpoint replaces them."""

from __future__ import annotations

import io
import json
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mvsink.config import S3Settings
from mvsink.frontier import Frontier
from mvsink.rows import parse_row_schema
from mvsink.s3 import ensure_bucket, s3_client
from mvsink.updates import normalize_updates
from services.write import checkpoint

pytestmark = pytest.mark.integration
ROWS = parse_row_schema("k string not null")


def test_a_parquet_checkpoint_loads_and_is_replaced(s3_settings: S3Settings) -> None:
    client = s3_client(s3_settings)
    ensure_bucket(client, s3_settings.bucket)
    sink = f"ckpt-{uuid.uuid4().hex[:6]}"
    rows = normalize_updates(pa.table({"k": ["a", "b"], "_time": [3, 3], "_diff": [1, -1]}), ROWS)
    meta = {
        "since": [3],
        "folded_offset": 7,
        "desired_frontier": [4],
        "persist_folded": [3],
        "writer_id": "w",
    }
    for version in (4, 5):  # the two versions a writer keeps, as Parquet
        buf = io.BytesIO()
        pq.write_table(rows.replace_schema_metadata({"mvsink.write": json.dumps(meta)}), buf)
        client.put_object(s3_settings.bucket, checkpoint.checkpoint_key(sink, 0, version, "parquet"),
                          io.BytesIO(buf.getvalue()), len(buf.getvalue()))  # fmt: skip
    state = checkpoint.load(sink, 0, 5, s3_settings, ROWS, 0)
    assert state.legacy and state.folded_offset == 7 and state.desired_frontier == Frontier.at(4)
    assert sorted(state.correction.consolidate().column("k").to_pylist()) == ["a", "b"]
    assert checkpoint.save(sink, 0, s3_settings, "w", state)  # writes version 6 as Arrow
    names = sorted(o.object_name.rsplit("/", 1)[-1] for o in
                   client.list_objects(s3_settings.bucket, prefix=f"sinks/{sink}/write/p0/"))  # fmt: skip
    assert names == [f"{6:020d}.arrow"]
    checkpoint.CACHE.clear()  # a new executor: loads version 6 from object storage
    again = checkpoint.load(sink, 0, 6, s3_settings, ROWS, 0)
    assert (
        not again.legacy
        and again.folded_offset == 7
        and again.correction.consolidate().num_rows == 2
    )
