"""ct: continual tasks, the seed's second sink (`continual_task.rs`) — a task watches its
*inputs* and, whenever one changes at time `T`, runs its logic over the input's changes at `T`
(and any references, including its own output as of `T-1`), writing the result to its output at
the same `T`. It never rewrites the past when references change later, and reacts only to new
input, so rehydration does not depend on the inputs' history.

```
 input shards ──(changes from the output's upper)──▶ times_extract ─▶ TimesReduce ─▶ append_times
      │                                                                                 │
      └──▶ changes at T ─┐                                                              ▼
 reference shards (as of T) ─▶ logic on Spark (SQL statements in order) ─▶ to_append ─▶ SinkState
 output as of T-1 (step_forward) ─┘                                                     │
                                            truncating_compare_and_append ◀─────────────┘
                                                       │
                                               output shard at T
```

A task is a TOML file (`mvsink.io.ct_definition`; examples in `examples/ct/`): its inputs,
references, output shard and row schema, `as_of`, whether the first run sees the inputs'
snapshot, and the logic as ordered `INSERT INTO <output> <query>` / `DELETE FROM <output>
WHERE ...` statements. `python -m services.ct` runs one task (`[ct] task` / `MVSINK_CT_TASK`);
`mvsink ct run|show|demo` run, inspect and demonstrate them. The compose file runs
`examples/ct/milestones.toml` over the demo view's shard.

Modules: `state` (the seed's operators, pure), `definition` (the task file), `logic` (one time's
statements on Spark), `sink` (`truncating_compare_and_append`), `shell` (the process).

Invariants (of `SinkState.process` and the shell)
-------------------------------------------------
1. Data is written only at an *append time*: a time at which some input changed, once the
   append times' progress (the meet of the inputs' uppers) has passed it.
2. Between append times the output's upper moves forward with no data.
3. A write at `T` holds the logic's diffs at `T` (consolidated), and moves the upper to `T+1`.
   The seed's inputs are their changes retracted again at `T+1`, so its `to_append`
   consolidates to the diffs at `T` alone; here the diffs of times the upper passed are dropped
   after each write, to the same effect.
4. Replicas race; a write whose time the output's upper has already passed is dropped, not
   retried (`truncating_compare_and_append`: the seed's HA strategy, losers throw away their
   result and read the winner's output).
5. A restart reads the inputs from the output's upper only: input batches wholly before it are
   never read. Each input and reference is leased at the output's upper (one lease per task,
   `ct.<name>`), so its `since` cannot pass the restart point while the task lives; a task down
   longer than `reader_lease` refuses to start if an input was compacted past its upper.
6. A task whose output's upper has not passed `as_of` starts at the later of `as_of` and the
   `since` of what it reads: changes at and after that time are its input (with `snapshot`,
   the contents before it are its first changes, at it). Its first write carries the output's
   upper past that time in one append, so a task that dies before it starts afresh again; one
   that has written keeps to its output's upper and never takes the snapshot again.
7. The leases are renewed on every round, not only when the output moves: an idle input or a
   reference that is not final can hold the output still for longer than a lease lives.

Every time an input changed at runs the logic, even if the input's diffs at it cancel (an update
of a row is a retraction and an insertion at one time); the seed's `times_extract` would drop
such a time (a seed quirk, kept and tested in `state`). An input's changes at a time are
consolidated before the logic sees them.

Read-only (`[sink] read_only`, the seed's TODO(ct1)): the replica follows the inputs and the
output's upper and contents, writes nothing, and starts writing from the output's upper on
`mvsink promote ct.<name>` (a `SinkControl` on `ct.<name>.control`, as for a view sink).
"""
