"""mint: mints batch descriptions and broadcasts them on `<sink>.descs` (port of the seed's
`mint` operator, `materialized_view_v2.rs`).

```
 frontiers (compacted)                     shard (S3)
   desired:<sink>:<p>  ──┐                   │ upper, polled every second
   persist:<shard>     ──┤                   v
 <sink>.control ─────────┴──> +------+  BatchDescription{lower, upper, append_worker}
   SinkControl{read_only}      | mint | ─────────────────────────────> <sink>.descs (1 partition)
                               +------+  transactional.id = mint.<sink>
```

Frontiers
---------
* `desired`: the meet of the progress of all P desired partitions (`DesiredProgress` records).
* `persist`: the shard's upper, from the shard itself (the truth) and from `ShardUpper`
  notifications; both only ever advance it. It starts at the sink's `as_of`, so the first
  lower is at or beyond it.

Invariants
----------
1. Minted lowers strictly increase, also across restarts: a new mint first fences the old one
   (`init_transactions`), then restores `last_lower` from the last committed description.
2. Minted uppers are monotone.
3. So at most one *valid* description is in flight: write and append keep only the latest.
4. The `desired` and `persist` frontiers only advance: a regressing progress or upper is
   ignored, and so is progress of a partition outside `0..P-1`.
5. A read-only mint mints nothing; promoted (`SinkControl{read_only: false}`), it is never
   read-only again.

Minting rule (seed): not read-only, `persist < desired`, and `persist` advanced past the last
minted lower; then `lower = persist`, `upper = desired`, `append_worker` round-robin over A.

Read-only mode
--------------
A mint started with `read_only` mints nothing, which keeps the whole sink passive; a
`SinkControl{read_only: false}` (`mvsink promote <sink>`) switches it to writing without a
restart. A writing mint is not demoted (as in the seed).

Failure handling
----------------
Crash at any point: an uncommitted description is aborted by the next mint's fencing; a
committed one is restored; records after the last description of this sink on `descs`
(undecodable, of another kind or sink) are dead-lettered with why and never stop a start. A
fenced mint exits 0 (the newer one carries on); any other fatal error of its producer starts
the mint again with a new one (`mvsink.io.health.StartAgain`), never an exit a supervisor
would not restart. Undecodable records on the followed topics are logged with
topic/partition/offset and skipped.

`python -m services.mint`; logic in `services.mint.state` (pure), I/O in `services.mint.shell`.
"""
