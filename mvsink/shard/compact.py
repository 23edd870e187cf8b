"""Compaction: running the merges the policy asks for (`mvsink.shard.state.maybe_merge`).

```
 shard state n ──maybe_merge──> MergeRequest(inputs = a run of live batches, since)
                                   │ one MergeTask per output desired partition
                                   v
          run_merge_task (a Spark executor, or this process for small merges):
            read the inputs' parts of its partition (other partitionings filtered by row hash)
            -> merge_updates (advance times before since, consolidate) -> stage one part
                                   │
                                   v
 compare_and_merge(request, outputs) ──> Merged (inputs replaced at version m)
                                     └─> MergeRefused (an input was taken by another
                                         merge: the outputs are deleted)
```

Who triggers merges: the write service's driver that owns desired partition 0 runs a
`services.write.compactor.Compactor` after its staging jobs (so compaction never delays a batch
in flight), with garbage collection (`mvsink.shard.gc`); `mvsink shard compact` forces one.
Several compactors (replicas racing on a shard, an operator's command) are safe: the loser's
compare-and-merge is refused and its outputs deleted.

Invariants:
1. A merge never changes the contents at any frontier `>= since` (its request's `since`, which
   the shard's never falls behind), so readers, write tasks holding a lease, and the
   self-correction loop see the same collection before and after.
2. Outputs keep one part per desired partition, so a write task still reads only its own.
3. A merge whose inputs are gone leaves nothing behind: its outputs are deleted, and if the
   deleter dies, the sweeper deletes them (never referenced, older than the grace).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from mvsink.core.errors import InvalidUsage
from mvsink.core.settings import CompactionPolicy, S3Settings, Timing
from mvsink.shard.parts import merge_updates
from mvsink.shard.state import (
    MergeRequest,
    PartRef,
    maybe_merge,
    merge_all,
    select_parts,
    staged_at,
)
from mvsink.shard.store import Merged, MergeRefused, MergeResult, PartGone, Shard


@dataclass(frozen=True)
class MergeTask:
    """One output partition of a merge (pickled to an executor)."""

    shard_id: str
    s3: S3Settings
    timing: Timing
    request: MergeRequest
    #: The output's desired partition (None: the one output of an unpartitioned merge).
    partition: int | None
    writer_id: str


@dataclass(frozen=True)
class MergeTaskResult:
    """What a merge task staged (None: its partition consolidated to nothing), or that an input
    part was gone (another merge replaced it: this merge will be refused)."""

    part: PartRef | None
    gone: bool = False


#: Runs merge tasks somewhere (this process, on the caller's shard handle given second; Spark
#: executors, each task on a handle of its own) and returns their results in order.
Runner = Callable[[list[MergeTask], Shard], list[MergeTaskResult]]


@dataclass(frozen=True)
class CompactionOutcome:
    """One merge: what was asked, what happened, and its cost."""

    request: MergeRequest
    result: MergeResult
    bytes_in: int
    bytes_out: int
    updates_out: int
    seconds: float
    where: str


def _open(task: MergeTask) -> Shard:
    """A handle on `task`'s shard, for a task run where the caller's handle is not."""
    from mvsink.shard import open_shard

    return open_shard(task.shard_id, None, task.s3, task.timing)


def run_merge_task(task: MergeTask) -> MergeTaskResult:
    """Read, merge and stage one output partition of `task.request` (module picture), on a
    shard handle of the task's own (a Spark executor's)."""
    return merge_on(_open(task), task)


def merge_on(shard: Shard, task: MergeTask) -> MergeTaskResult:
    """`run_merge_task` with the handle `shard`."""
    request, partition = task.request, task.partition
    total, partitioning = request.partitions_total, request.partitioning
    selected = select_parts(request.inputs, partition, total, partitioning)
    wanted = None if partition is None else [partition]
    try:
        table = shard.read_parts(selected, wanted, total, partitioning)
    except PartGone:
        return MergeTaskResult(None, gone=True)
    merged = merge_updates(table, shard.schema, request.advance_before)
    if merged.num_rows == 0:
        return MergeTaskResult(None)
    part = shard.stage(
        merged,
        request.lower,
        request.upper,
        task.writer_id,
        partition,
        total if partition is not None else None,
        partitioning,
    )
    return MergeTaskResult(part)


#: Nice value of the threads that run merges in-process (RocksDB's low-priority pool), where
#: `SCHED_IDLE` is not available: a merge then takes the CPU the pipeline leaves idle.
MERGE_NICENESS = 19


def _lower_priority() -> None:
    """Run this thread only when no other wants the CPU: Linux's `SCHED_IDLE` (threads are
    scheduled as tasks; a woken pipeline thread takes the CPU from it at once), else nice
    `MERGE_NICENESS`; elsewhere, or without permission, a no-op."""
    tid = threading.get_native_id()
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        return
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, tid, MERGE_NICENESS)


def run_locally(tasks: list[MergeTask], shard: Shard | None = None) -> list[MergeTaskResult]:
    """Merge tasks in this process, two at a time (Arrow releases the GIL), on low-priority
    threads, on the caller's handle `shard` (None: one opened for them)."""
    if not tasks:
        return []
    handle = _open(tasks[0]) if shard is None else shard
    with ThreadPoolExecutor(max_workers=2, initializer=_lower_priority) as pool:
        return list(pool.map(lambda task: merge_on(handle, task), tasks))


def spark_runner(spark: Any) -> Runner:
    """A runner with one Spark task per merge task, on the session's executors."""

    def run(tasks: list[MergeTask], shard: Shard) -> list[MergeTaskResult]:
        results: list[MergeTaskResult] = (
            spark.sparkContext.parallelize(tasks, len(tasks)).map(run_merge_task).collect()
        )
        return results

    return run


def merge_tasks(shard: Shard, request: MergeRequest, writer_id: str) -> list[MergeTask]:
    """The tasks of `request`: one per output desired partition (one if unpartitioned)."""
    if shard.s3 is None:
        raise InvalidUsage("merges need a shard opened with its S3 settings (open_shard)")
    total = request.partitions_total
    targets: list[int | None] = [None] if total is None else list(range(total))
    return [
        MergeTask(shard.shard_id, shard.s3, shard.timing, request, p, writer_id) for p in targets
    ]


def compact_once(
    shard: Shard,
    policy: CompactionPolicy,
    writer_id: str,
    runner: Runner = run_locally,
    *,
    force: bool = False,
    large: Runner | None = None,
    large_bytes: int = 64 * 2**20,
) -> CompactionOutcome | None:
    """Plan the merge the shard needs now (every live batch if `force`), run it, and
    compare-and-merge it; None if there is nothing to merge. Merges whose inputs hold more
    than `large_bytes` run on `large` (Spark) when given.

    Raises:
        IndefiniteAppend, S3 errors: as `Shard.compare_and_merge`; the outputs are then garbage
            for the sweeper.
    """
    started = time.monotonic()
    state = shard.state()
    request = merge_all(state) if force else maybe_merge(state, policy)
    if request is None:
        return None
    chosen, where = runner, "local"
    if large is not None and request.bytes > large_bytes:
        chosen, where = large, "spark"
    results = chosen(merge_tasks(shard, request, writer_id), shard)
    parts = tuple(r.part for r in results if r.part is not None)
    if any(r.gone for r in results):
        shard.delete_staged(parts)
        result: MergeResult = MergeRefused(shard.state().seqno)
    else:
        parts = _fresh(shard, parts)
        result = shard.compare_and_merge(request, parts)
    bytes_out = sum(p.bytes for p in parts) if isinstance(result, Merged) else 0
    updates_out = sum(p.updates for p in parts) if isinstance(result, Merged) else 0
    return CompactionOutcome(
        request, result, request.bytes, bytes_out, updates_out, time.monotonic() - started, where
    )


def _fresh(shard: Shard, parts: tuple[PartRef, ...]) -> tuple[PartRef, ...]:
    """A merge's outputs, those staged more than half of `max_part_age` ago staged again
    (`Shard.restage`: a copy, not the merge again). A merge's tasks may run one after another
    (two at a time in this process, a task a core on Spark), so its first outputs can age past
    `max_part_age` before the last is staged; compare-and-merge would refuse them, and the
    merge planned again would meet the same: compaction would never commit on a shard that
    large. What is left: copying the old outputs must take less than half the bound, and a
    compactor paused past it here is refused once and plans again."""
    bound, now = shard.timing.max_part_age / 2, shard.clock.time()
    return tuple(shard.restage(p) if now - staged_at(p.key) > bound else p for p in parts)


def shard_table_bytes(shard: Shard) -> tuple[int, int]:
    """(objects, bytes) under the shard's prefix in the bucket: live, retained and garbage."""
    listed = shard.blob.list(f"{shard.prefix}/", recursive=True)
    return len(listed), sum(o.size for o in listed)


__all__ = [
    "CompactionOutcome",
    "MergeTask",
    "MergeTaskResult",
    "Runner",
    "compact_once",
    "merge_tasks",
    "run_locally",
    "run_merge_task",
    "shard_table_bytes",
    "spark_runner",
]
