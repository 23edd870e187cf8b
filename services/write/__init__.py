"""write: keeps `corrections = desired - persist` per desired partition on Spark and stages the
correction batches for each batch description (port of the seed's `write` operator and
`Correction` buffer, `materialized_view_v2.rs`).

```
 <sink>.descs ────────────┐                                   shard (S3): parts appended
 frontiers (desired:*, ───┤  +--------------+  one Spark task    since the last fold (-)
   persist:<shard>)       ├─>| write driver |──per owned ──────> <sink>.desired offsets (+)
 <sink>.control ──────────┘  +--------------+  partition          │ stage part < upper
                               │ group <sink>.write (ownership)    v checkpoint corrections
                               └──> StagedBatch ──> <sink>.batches[desc.append_worker]
```

Frontiers
---------
* the description: the latest valid one (a regressing lower is dropped);
* `persist`: the shard's upper (polled, and `ShardUpper` notifications);
* `desired`: progress of each owned partition (`DesiredProgress`, written by the producer in
  the same transaction as the in-band `Progress`).

Invariants
----------
0. The driver's reader lease holds the shard's `since` at or before the least upper its
   partitions' corrections have folded, so merges keep every change they still have to read
   distinct (a task whose checkpoint `since` passed anyway rebuilds from all of desired).
1. A batch is staged only when the shard's upper equals the description's lower (the
   read-back is folded up to it) and every owned partition's desired progress is `>= upper`.
2. A partition is staged at most once per lower by a driver; a partition gained in a
   rebalance is staged for the current lower too.
3. Written updates stay in the corrections until the read-back cancels them
   (self-correction): a lost append is simply written again later.
4. A partition's correction state moves forward by conditional checkpoints: two owners of one
   partition cannot both continue from the same version.

Read-only mode
--------------
No descriptions arrive (mint mints none), and the driver keeps folding desired and persist
and consolidating every `FOLD_INTERVAL`, so memory stays bounded and promotion is fast. It
writes no data and never moves the shard's upper; it does hold a reader lease (a state version
now and then, like persist's leased readers), so the shard's `since` waits for its folds. It
does not compact (mint mints nothing for it, and compaction follows staging jobs).

Placement
---------
Each batch runs one task per executor core: resident ones (`services.write.resident`, long-lived
Spark tasks that take each batch's steps over a socket, so a batch costs no Spark job), or a
one-shot Spark job of the same tasks where the residents cannot serve. A partition's task goes
to the executor holding its warm state (`services.write.affinity`: a stable partition ->
executor map learned from where tasks ran, as Spark executor locality preferences), whose
Python workers share it through the executor's local directory (`services.write.checkpoint`). The code reaches a cluster's
executors as a zip the driver builds and ships at start (`mvsink.spark`).

Failure handling
----------------
A killed driver or executor loses nothing: the next task resumes from the last checkpoint
(desired offsets and shard state both replayable), in whichever executor Spark runs it, which
becomes the partition's home; parts staged but never reported are garbage for the sweeper. Invalid desired records (undecodable, or an update below its
partition's progress) go to `<sink>.dead-letter` with topic/partition/offset and the reason,
and never reach the shard.

`python -m services.write`; decisions in `services.write.state` (pure), the buffer in
`services.write.correction` (pure Arrow), placement in `services.write.affinity` (pure), the
per-partition task in `services.write.task` (run by `services.write.resident`), its folds in
`services.write.fold` and its checkpoints in `services.write.checkpoint`, the compactor thread
in `services.write.compactor`, I/O in `services.write.shell`.
"""
