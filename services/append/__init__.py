"""append: commits all staged parts of a batch description with one compare-and-append on
the shard and publishes the new upper (port of the seed's `append` operator,
`materialized_view_v2.rs`).

```
 <sink>.descs (every record, no group) ──┐
                                         v
 <sink>.batches ── group <sink>.append ─> +--------+ compare_and_append ──> shard (S3)
   StagedBatch, partition = append_worker | append |
                                          +--------+ ShardUpper ──> frontiers (persist:<shard>)
```

Frontiers
---------
Each owned append worker (= owned partition of `batches`) keeps `lower`: the greatest lower
seen in descriptions and batches. Timely's `batches` frontier becomes *coverage*: the
description for `lower` is complete when its `StagedBatch`es cover all P desired partitions.

Invariants
----------
1. `lower` never regresses; anything stashed for an older lower is outdated.
2. At most one append per lower, only for this worker's description, only when complete.
3. Parts of outdated, duplicate or failed batches are only ever deleted, never appended; the
   shard library refuses to delete a part a retained state references or that could still be
   appended, so a redelivered or duplicated `StagedBatch` can never delete committed data.
4. Parts the shard refused as too old (`PartTooOld`: staged longer ago than `max_part_age`)
   are deleted, and the worker keeps its lower and description: it appends the next complete
   set of fresh parts for them, which the write drivers stage again.

Appending (seed): if the shard's upper is behind `lower`, advance it to `lower` with an empty
append and retry; any other mismatch is expected under concurrent replicas (the feedback loop
corrects it later): `lower` moves to the shard's upper. `ShardUpper` is published after every
outcome. The version an append creates also advances the shard's `since` (its `retain_history`,
which append sets from the sink's config at start, and the live reader leases): no extra
version. Merges and garbage collection are the write service's (`services.write.compactor`).

Failure handling
----------------
`batches` offsets are committed only up to the first batch still needed, so a crash redelivers
what was not settled; redelivered batches for a passed lower are harmless. Undecodable records
are logged with topic/partition/offset and copied to `<sink>.dead-letter`.

`python -m services.append`; logic in `services.append.state` (pure), I/O in
`services.append.shell`.
"""
