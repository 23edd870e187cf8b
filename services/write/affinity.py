"""Where each desired partition's task runs: partition affinity (pure; no Spark here).

A partition's warm state (its corrections and the parts it staged, so the read-back of its own
parts costs nothing) lives in the executor that ran its last task: in the Python worker's
memory, and in a directory the executor's Python workers share (`services.write.checkpoint`).
Any other executor must read the checkpoint and the parts back from object storage. So the
driver keeps a stable partition -> executor map, `home`, learned from where each task really
ran, and asks Spark to run each partition's task there (`mvsink.io.spark.run_pinned`):

* a partition stays on its home while that executor lives;
* a partition without a live home (new, or its executor died: Spark has already rescheduled
  the task that was running there) goes to the least loaded live executor;
* executors stay balanced within one partition: when one joins (workers scaled up), the fewest
  partitions move to it. Each move costs one cold load, once.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping


def place(
    partitions: Iterable[int], home: Mapping[int, str], executors: Collection[str]
) -> dict[int, str]:
    """Each of `partitions` -> a live executor of `executors` (see the module docs)."""
    live = sorted(executors)
    if not live:
        raise ValueError("no live executors to place partitions on")
    wanted = sorted(set(partitions))
    placed = {p: home[p] for p in wanted if home.get(p) in executors}
    load = {e: 0 for e in live}
    for executor in placed.values():
        load[executor] += 1
    for partition in wanted:
        if partition not in placed:
            target = min(live, key=lambda e: (load[e], e))
            placed[partition] = target
            load[target] += 1
    while True:
        most = max(live, key=lambda e: (load[e], e))
        least = min(live, key=lambda e: (load[e], e))
        if load[most] - load[least] <= 1:
            return placed
        moved = max(p for p, e in placed.items() if e == most)
        placed[moved] = least
        load[most] -= 1
        load[least] += 1


def groups(placement: Mapping[int, str], slots: int) -> list[tuple[list[int], str]]:
    """One task per executor core: each executor's partitions dealt into at most `slots`
    groups (one wave of tasks per job: each wave pays Spark's scheduling again)."""
    by_executor: dict[str, list[int]] = {}
    for partition, executor in sorted(placement.items()):
        by_executor.setdefault(executor, []).append(partition)
    result: list[tuple[list[int], str]] = []
    for executor, partitions in sorted(by_executor.items()):
        count = max(1, min(slots, len(partitions)))
        result.extend((partitions[i::count], executor) for i in range(count))
    return result
