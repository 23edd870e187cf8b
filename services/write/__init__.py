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
0. The shard's `since` never passes the upper a partition's newest durable checkpoint has
   folded (`persist_folded`), so merges keep every change a task still has to read distinct:
   the driver's reader lease holds it at the least such upper of its partitions while the
   driver runs, and each partition's critical hold (`checkpoint:<sink>:p<N>`) holds it at its
   checkpoint whether or not any driver runs. The lease lapses after `reader_lease` (a driver
   paused or down longer leaves only the holds); the holds never lapse, they move forward when
   a newer checkpoint is durable, so a driver that comes back after any pause continues from
   its checkpoints. (A task whose checkpoint `since` passed anyway, one from before holds,
   rebuilds from all of desired.)
1. A batch is staged only when the shard's upper equals the description's lower (the
   read-back is folded up to it) and every owned partition's desired progress is `>= upper`.
   A shard whose upper is still before the sink's `as_of` counts as at `as_of` (the seed's
   `advance_persist_frontiers_at_startup`): the first batch's lower is `as_of`, everything
   desired before it advanced into that batch, and append moves the upper there first.
2. A partition is staged at most once per lower by a driver; a partition gained in a
   rebalance is staged for the current lower too.
3. Written updates stay in the corrections until the read-back cancels them
   (self-correction): a lost append is simply written again later.
4. A partition's correction state moves forward by conditional checkpoints: two owners of one
   partition cannot both continue from the same version. A version is created only from the
   version before it as created by this owner or loaded durable. A resident's staging step may
   report its part while its checkpoint is being created (`services.write.state.Pipelined`); the
   partition's next step waits for that create before anything else, and is stale if it was
   lost. The parts need no more: each is `desired(< upper) - shard(< lower)` whichever state
   staged it, and append keeps one per lower and partition. What lets go of history follows
   versions known created only: the lease, the critical holds, the kept desired offsets and
   the deletion of old versions.
5. Desired is never folded with a hole: records a step needs below the partition's log start
   make it stage and checkpoint nothing (`services.write.fold`), and the driver stages nothing
   for the sink until the checkpoint is restored or repaired (`services.write.repair`).

The desired topic's life
------------------------
Records below the older of a partition's two newest checkpoints are never read again: the
driver deletes them every `[sink] trim_interval` (never the partition's last record), so the
topic stays bounded; provisioning sets its `retention.ms` to -1 so no broker default deletes
what a checkpoint still needs. `mvsink sink show` prints each partition's log start,
checkpoint and hold; `mvsink repair` re-seeds checkpoints whose records are gone, trusting the
shard.

Read-only mode
--------------
No descriptions arrive (mint mints none), and the driver keeps folding desired and persist
and consolidating (where updates can cancel) every `FOLD_INTERVAL`, so memory stays bounded
and promotion is fast. It writes no data and never moves the shard's upper; it does hold a
reader lease (a state version now and then, like persist's leased readers), so the shard's
`since` waits for its folds. It does not compact (mint mints nothing for it, and compaction
follows staging jobs).

Placement
---------
Each batch runs one task per executor core: resident ones (`services.write.resident`, long-lived
Spark tasks that take each batch's steps over a socket, so a batch costs no Spark job), or a
one-shot Spark job of the same tasks where the residents cannot serve. A partition's task goes
to the executor holding its warm state (`services.write.affinity`: a stable partition ->
executor map learned from where tasks ran, as Spark executor locality preferences), whose
Python workers share it through the executor's local directory (`services.write.checkpoint`).
The code reaches a cluster's executors as a zip the driver builds and ships at start
(`mvsink.io.spark`).

Many sinks
----------
With `[service] sinks = all` one write process runs a driver per defined sink (`mvsink.io.host`;
`services.write.shell.host`), all in one Spark application: each driver is exactly a one-sink
process's, so every invariant above holds per sink, with its own checkpoints, corrections,
reader lease and holds (its writer id ends in the sink id); what they share is the Spark
application, whose fair scheduler gives each sink's jobs a pool of their own, and one crew of
resident tasks (`services.write.resident.SharedCrew`), whose rounds the drivers take in turn.

Failure handling
----------------
A killed driver or executor loses nothing: the next task resumes from the last checkpoint
(desired offsets and shard state both replayable), in whichever executor Spark runs it, which
becomes the partition's home; parts staged but never reported are garbage for the sweeper.
Invalid desired records (undecodable, or an update below its partition's progress) go to
`<sink>.dead-letter` with topic/partition/offset and the reason, and never reach the shard.

`python -m services.write`; decisions in `services.write.state` (pure: the driver's
`WriteState`, each task step's plan, `plan_start` and `plan_batch`, and the closed unions of a
step's checkpoint mode and outcome) and `services.write.chain` (pure: each owned partition's
checkpoint chain, `Chains`, whose commands the shell dispatches), the buffer in
`services.write.correction` (pure Arrow), placement in `services.write.affinity` (pure), the
per-partition step in `services.write.task` (a `StepSpec` of a `SinkSpec`, run in a
`WriteWorker` that holds what a Python worker keeps between steps; one-shot Spark tasks use
their Python worker's `task.PROCESS` one, `services.write.resident` its own), its folds in
`services.write.fold` and its checkpoints in `services.write.checkpoint`, the compactor thread
in `services.write.compactor`, I/O in `services.write.shell`.
"""
