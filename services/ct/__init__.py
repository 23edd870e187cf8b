"""ct: continual tasks, the seed's second sink (`continual_task.rs`) — a task watches its
*inputs* and, whenever one changes at time `T`, runs its logic over the input's changes at `T`
(and any references, including its own output as of `T-1`), writing the result to its output at
the same `T`. It never rewrites the past when references change later, and reacts only to new
input, so rehydration does not depend on the inputs' history.

What exists so far is the pure core, `services.ct.state` (`times_extract`, `TimesReduce`,
`step_forward`, `SinkState`), and `services.ct.sink.truncating_compare_and_append` over the
shard library. The service around them (`python -m services.ct`), the task definitions and the
demo are not built yet (issue 15).

Invariants (of `SinkState.process`)
------------------------------------
1. Data is written only at an *append time*: a time at which some input changed, once the
   append times' progress has passed it (times may arrive out of order).
2. Between append times the output's upper moves forward with no data.
3. A write at `T` holds the to-append collection as of `T` (earlier times advanced to `T`,
   consolidated), and moves the upper to `T+1`.
4. Replicas race; a write whose time the output's upper has already passed is dropped, not
   retried (`truncating_compare_and_append`: the seed's HA strategy, losers throw away their
   result).
"""
