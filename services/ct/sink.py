"""Writing a continual task's output (the seed's `truncating_compare_and_append`): the one
function of `services.ct` that touches the shard."""

from __future__ import annotations

from typing import NamedTuple

import pyarrow as pa

from mvsink.core.frontier import Frontier
from mvsink.shard import Appended, Shard


class Truncated(NamedTuple):
    """The outcome of a truncating compare-and-append."""

    #: The latest upper known after it (`new_upper` when `written`; at or past it when a
    #: racing replica got there first, before it only if the shard's upper regressed, never).
    upper: Frontier
    #: Whether this call appended the batch (False: a replica wrote these times; drop ours).
    written: bool


def truncating_compare_and_append(
    shard: Shard, updates: pa.Table, new_upper: Frontier, writer_id: str
) -> Truncated:
    """Append `updates` (all at times before `new_upper`) as the batch `[upper, new_upper)` from
    the shard's current upper.

    A write the upper has already reached or passed is dropped, not retried: a racing replica
    wrote that time first and its result stands (the seed's HA strategy). When the upper moved
    but is still before `new_upper`, the same updates are staged again for the new lower (the
    shard binds parts to their batch bounds) and appended from there. A part staged for a lost
    attempt is deleted.

    Raises:
        InvalidUsage: an update at or after `new_upper`, or before the upper it is appended at
            (`SinkState.process` writes only at `new_upper - 1`, which no upper before
            `new_upper` passes).
        IndefiniteAppend: as `Shard.compare_and_append`; read the upper and call again.
    """
    expected = shard.upper()
    while expected.less_than(new_upper):
        parts = [shard.stage(updates, expected, new_upper, writer_id)] if updates.num_rows else []
        result = shard.compare_and_append(parts, expected, new_upper)
        if isinstance(result, Appended):
            return Truncated(new_upper, True)
        shard.delete_staged(parts)
        expected = result.current
    return Truncated(expected, False)
