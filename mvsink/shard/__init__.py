"""A persist-style shard on object storage alone: staged Parquet parts plus a linearizable log
of immutable state versions (the seed's `persist`: Blob + Consensus, done with S3 conditional
writes), kept small forever by `since`, merges and garbage collection. No Kafka or Spark in this
package's core; `mvsink.shard.spark` is the Spark reader, `mvsink.shard.compact` runs merges.

Layout (docs/design.md §3.2)::

    <bucket>/shards/<shard_id>/state/<seqno:020d>                  JSON, created If-None-Match: *
    <bucket>/shards/<shard_id>/parts/<writer_id>/<unix_ms>-<uuid>.parquet   write-once

(The part file name starts with its staging time in milliseconds so that age checks need no
extra request; the reference design names it `<uuid>.parquet`, which this extends: see
docs/design.md §7.)

A state version (`mvsink.shard.state`, format 2) holds `seqno`, `upper`, `since`,
`retain_history`, the row schema, the *live* batches (`{lower, upper, seqno, parts}`), the
reader leases, what the version changed, and a nonce. Its size is O(live batches), not
O(history): merged batches are gone from it.

Linearizability
---------------
Every change is one compare-and-set: read the latest version `n`; compute `n+1` from it by a
pure function (`apply_append`, `apply_merge`, `apply_lease`, ...; an expected outcome such as
`UpperMismatch` or `MergeRefused` is returned instead); create `n+1` with `If-None-Match: *`; on
a lost race (412), start over from the new latest; once created, prove it is the successor of
`n` (`Shard._proven`), and start over if not. Storage is reached only through `blob.Blob` and
time only through `blob.Clock`, so `tests/sim` runs this code under a virtual clock and injected
faults.

The argument rests on no clock. Versions are created strictly in seqno order, each by a writer
that read its predecessor; the collector prunes versions oldest first and never the latest. So:

* a read (`state`) is one LIST of the state keys after the version last seen: its newest key
  was the latest version while the LIST ran, and is used only with the etag the LIST returned;
  an empty LIST proves the version last seen is still the latest (a pruned version has a
  successor, which would be listed). S3 (and MinIO) LISTs are strongly consistent;
* a create of `n+1` can succeed at a key the collector pruned (S3 cannot refuse it: the key is
  absent). That needs a newer version to have existed before the create, and the latest is
  never pruned, so one is listed after it: ours listed alone after `n` proves the create, and
  so does an `n+2` whose `prev` (each version records the nonce of the one it was computed
  from) is ours, since only a latest version is built on. Otherwise (the writer paused longer
  than `version_grace` between its read and its create, or a late retry of a lost reply landed
  after pruning, which writes a pruned version back byte for byte: etags prove nothing) it
  starts over from the latest version, where a change that did land shows (an append as
  `UpperMismatch`); the stray object is never read as a version, and the collector keeps only
  the run of versions linked by `prev` and deletes the rest (`gc.collect_garbage`).

A create whose HTTP outcome is unknown is retried with the *same bytes*: a 412 on identical
content means it was ours (`mvsink.io.s3.conditional_put`), so no change happens twice and none is
lost silently; if it stays unknown, `IndefiniteAppend` tells the caller to re-read.

Deleting parts is fenced the same way (`gc`): the sweeper moves the state's `sweep_horizon`
past every unreferenced part it will delete before it deletes, and every append and merge pass
refuses parts staged before the horizon of the version it computes from. The time bounds of
`Timing` only decide when something is worth deleting; what happens to a process that pauses
past each of them is in docs/design.md §4.4 ("Fences").

`since`, leases, critical holds and merges
------------------------------------------
`since` trails the upper by the shard's `retain_history` (times; `None` keeps everything) and
never passes a live reader lease's hold nor a critical hold. Reads at `as_of < since` fail with
`AsOfBeforeSince`. The two kinds of hold answer two questions:

* a *reader lease* (`Shard.lease`, renewed before `Timing.reader_lease` runs out) is for a
  process that is reading: it lapses when the process goes away, so a crashed reader holds
  nothing for long. A reader paused for longer than its lease finds `since` moved on
  (`AsOfBeforeSince` at its next read or renewal) and must start over from what `since` left;
* a *critical hold* (`ShardState.holds`, persist's critical `SinceHandle`) is for durable state
  a reader continues from after any pause, e.g. the write service's correction checkpoint of a
  desired partition (`checkpoint:<sink>:p<N>`). It has no expiry: it moves only when its
  holder moves it (forward, in the same version as a lease, `Shard.lease(..., holds=...)`),
  is set exactly (`Shard.set_holds`: backwards too, never before `since`) or is dropped
  (`Shard.release_holds`). Nothing about it depends on a clock: a holder paused for a week
  finds `since` where it left it. Its cost is that a holder that is gone for good holds `since`
  back until someone releases it (`mvsink sink release`).

A merge (`Shard.compare_and_merge`) replaces a contiguous run of live batches by one batch whose
updates at times before `since` are advanced and consolidated, one part per desired partition;
it is made only if every input is still live, so it races safely with appends, other compactors
and replicas. Which merges run, where and who triggers them: `mvsink.shard.compact`.

What a reader may assume: versions are gap-free from the oldest retained one of the chain; `upper` and
`since` never regress; the contents at any frontier `since <= as_of <= upper` never change
(`snapshot(as_of)` is repeatable while a lease holds `as_of`); a part referenced by the latest
version is never deleted, and one a merge replaced lives `Timing.part_grace` more, after which a
reader of the old version gets `PartGone` and reads the latest version instead (`snapshot` does
that itself), unless a live lease pins that version (`Shard.lease(..., pin=True)`,
`mvsink.shard.pin`: for reads that cannot start over midway, such as a Spark job). Deleting is
`mvsink.shard.gc`.
"""

from __future__ import annotations

import pyarrow as pa

from mvsink.core.errors import InvalidUsage
from mvsink.core.settings import S3Settings, Timing
from mvsink.io.s3 import s3_client
from mvsink.shard.gc import DeleteResult, GcResult, SweepResult
from mvsink.shard.parts import UpdateBeyondUpper, UpdateNotBeyondLower, consolidate_at
from mvsink.shard.state import (
    Appended,
    AppendResult,
    AsOfBeforeSince,
    BatchRecord,
    CriticalHold,
    MergeRequest,
    PartRef,
    PartTooOld,
    ReaderLease,
    SchemaMismatch,
    SelectedPart,
    ShardState,
    UpperMismatch,
)
from mvsink.shard.store import (
    IndefiniteAppend,
    Merged,
    MergeRefused,
    MergeResult,
    PartGone,
    Shard,
    ShardNotFound,
)

__all__ = [
    "AppendResult",
    "Appended",
    "AsOfBeforeSince",
    "BatchRecord",
    "CriticalHold",
    "DeleteResult",
    "GcResult",
    "IndefiniteAppend",
    "InvalidUsage",
    "MergeRefused",
    "MergeRequest",
    "MergeResult",
    "Merged",
    "PartGone",
    "PartRef",
    "PartTooOld",
    "ReaderLease",
    "SchemaMismatch",
    "SelectedPart",
    "Shard",
    "ShardNotFound",
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
    retain_history: int | None = None,
) -> Shard:
    """Open shard `shard_id` in `s3.bucket`, creating it (version 0: `upper = since = {0}`,
    `retain_history` as given) on first use. `schema=None` opens an existing shard with its
    stored schema (readers, tools); an existing shard keeps its `retain_history`
    (`Shard.set_retain_history` changes it).

    Raises:
        SchemaMismatch: the shard exists with another row schema.
        ShardNotFound: `schema=None` and the shard does not exist.
    """
    shard = Shard.create_or_open(
        s3_client(s3), s3.bucket, shard_id, schema, timing or Timing(), retain_history
    )
    shard.s3 = s3
    return shard
