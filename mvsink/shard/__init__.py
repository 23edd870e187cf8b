"""A persist-style shard on object storage alone: staged Parquet parts plus a linearizable log
of immutable state versions (the seed's `persist`: Blob + Consensus, done with S3 conditional
writes). No Kafka or Spark in this package's core; `mvsink.shard.spark` is the Spark reader.

Layout (DESIGN §3.2)::

    <bucket>/shards/<shard_id>/state/<seqno:020d>                  JSON, created If-None-Match: *
    <bucket>/shards/<shard_id>/parts/<writer_id>/<unix_ms>-<uuid>.parquet   write-once

(The part file name starts with its staging time in milliseconds so that age checks need no
extra request; DESIGN names it `<uuid>.parquet`, which this extends.)

A state version holds `seqno`, `upper`, `since`, the row schema, every batch with data
(`{lower, upper, seqno, parts}`), the batch this version appended, and a nonce.

Linearizability
---------------
Every change is `compare_and_append(parts, expected_upper, new_upper)`: read the latest version
`n`; if `upper != expected_upper` return `UpperMismatch(current)`; else create `n+1` (computed
from `n` by a pure function) with `If-None-Match: *`. Versions therefore form a chain in which
`n+1` was computed from `n` by a writer that saw `n` as the latest: a create that loses (412)
means someone else's `n+1` exists, and the writer starts over from it. The linearization point
of an append is the successful create of its version; of a read (`state()`, `upper()`), the
read of the first missing seqno after the last present one. S3 (and MinIO) give
read-after-write consistency for GET/PUT/LIST, so a version created before a read starts is
seen by it. A create whose HTTP outcome is unknown is retried with the *same bytes*: a 412 on
identical content means it was ours (`mvsink.s3.conditional_put`), so no append happens twice
and none is lost silently; if it stays unknown, `IndefiniteAppend` tells the caller to re-read.

What a reader may assume: versions are gap-free from the oldest retained one; `upper` never
regresses; the contents at any frontier `<= upper` never change (`snapshot(as_of)` is
repeatable); a part referenced by a retained version is never deleted.

Deleting
--------
Pruning state versions would let a slow writer re-create a pruned seqno, and deleting a staged
part could race the append that commits it. Three time bounds (`Timing`) close both:
a compare-and-append never writes `n+1` more than `max_attempt_age` after reading `n`, and
refuses parts staged more than `max_part_age` ago; `sweep` only prunes versions and deletes
unreferenced parts older than `grace >= min_grace > max_part_age + max_attempt_age`. This
assumes clocks (the sweeper's, the writers', S3's timestamps) agree to within
`min_grace - max_part_age - max_attempt_age`. `delete_staged` needs no clock: it deletes a part
only when no retained version references it and the upper has passed the part's `lower`, after
which no compare-and-append for its bounds can succeed.
"""

from __future__ import annotations

import pyarrow as pa

from mvsink.errors import InvalidUsage
from mvsink.s3 import s3_client
from mvsink.settings import S3Settings, Timing
from mvsink.shard.parts import UpdateBeyondUpper, UpdateNotBeyondLower, consolidate_at
from mvsink.shard.state import (
    BatchRecord,
    PartRef,
    SchemaMismatch,
    SelectedPart,
    ShardState,
)
from mvsink.shard.store import (
    Appended,
    AppendResult,
    DeleteResult,
    IndefiniteAppend,
    PartTooOld,
    Shard,
    SweepResult,
    UpperMismatch,
)

__all__ = [
    "AppendResult",
    "Appended",
    "BatchRecord",
    "DeleteResult",
    "IndefiniteAppend",
    "InvalidUsage",
    "PartRef",
    "PartTooOld",
    "SchemaMismatch",
    "SelectedPart",
    "Shard",
    "ShardState",
    "SweepResult",
    "Timing",
    "UpdateBeyondUpper",
    "UpdateNotBeyondLower",
    "UpperMismatch",
    "consolidate_at",
    "open_shard",
]


def open_shard(
    shard_id: str,
    schema: pa.Schema | None,
    s3: S3Settings,
    timing: Timing | None = None,
) -> Shard:
    """Open shard `shard_id` in `s3.bucket`, creating it (version 0: `upper = since = {0}`) on
    first use. `schema=None` opens an existing shard with its stored schema (readers, tools).

    Raises:
        SchemaMismatch: the shard exists with another row schema.
        MvsinkError: `schema=None` and the shard does not exist.
    """
    return Shard.create_or_open(s3_client(s3), s3.bucket, shard_id, schema, timing or Timing())
