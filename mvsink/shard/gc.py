"""Deleting what no reader or writer can still use (persist's `gc.rs`), and nothing else.

Three kinds of garbage, three rules (the time bounds are `Timing`'s):

1. **Parts a merge replaced** (referenced by version `n`, not by `n+1`): such a key never returns
   (appends and merges take only fresh keys whose bounds the upper has not passed), so it is
   deleted once version `n+1` is older than `part_grace`. A reader still reading version `n`
   after that finds a part gone (`PartGone`) and starts over from the latest version, which
   holds the same contents at every frontier `>= since`.
2. **Superseded state versions**: version `n` is pruned once `n+1` is older than
   `version_grace > max_attempt_age + request_timeout`, oldest first (the retained versions stay
   gap-free). A writer that read `n` while it was the latest gives up on creating `n+1` before
   then, so a pruned seqno is never created again. Parts a version dropped are deleted (1.)
   before that version is pruned, so pruning leaks nothing.
3. **Parts never referenced** (a writer died between staging and appending, a merge result
   that lost its race and whose deleter died): the sweeper deletes parts no retained version
   references once older than a grace `>= min_grace > max_part_age + max_attempt_age`;
   compare-and-append and compare-and-merge refuse parts older than `max_part_age`.
   `delete_staged` needs no clock: it deletes a part only when no retained version references
   it and the upper has passed the part's `lower`, after which no append for it can succeed.

A crash at any point leaves only garbage one of the rules above removes later. Clocks (this
process's, the writers', S3's timestamps) are assumed to agree within the slack of the bounds.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pyarrow as pa
from minio.deleteobjects import DeleteObject
from minio.error import S3Error

from mvsink.errors import InvalidUsage, MvsinkError
from mvsink.frontier import Frontier
from mvsink.s3 import get_bytes
from mvsink.shard.parts import footer_metadata
from mvsink.shard.state import PartRef

if TYPE_CHECKING:
    from mvsink.shard.store import Shard


@dataclass(frozen=True)
class DeleteResult:
    """Outcome of `delete_staged`: what was deleted and what was refused, and why."""

    deleted: tuple[str, ...]
    #: Referenced by a retained state version: committed data.
    referenced: tuple[str, ...]
    #: Staged for a lower the shard has not passed: it could still be appended.
    pending: tuple[str, ...]
    #: Its footer says other bounds than claimed (a wrong or forged `StagedBatch`): not
    #: trusted, not deleted.
    mismatched: tuple[str, ...] = ()


@dataclass(frozen=True)
class GcResult:
    """Outcome of `collect_garbage`."""

    #: Parts replaced by merges, deleted now.
    parts_deleted: tuple[str, ...]
    states_pruned: tuple[int, ...]
    #: State versions retained after pruning.
    states_retained: int


@dataclass(frozen=True)
class SweepResult:
    """Outcome of `sweep`."""

    parts_deleted: tuple[str, ...]
    parts_kept_young: int
    parts_referenced: int
    states_pruned: tuple[int, ...]


def staged_at(key: str) -> float:
    """Staging time (unix seconds) encoded in a part key `.../<unix_ms>-<uuid>.parquet`."""
    name = key.rsplit("/", 1)[-1]
    try:
        return int(name.split("-", 1)[0]) / 1000.0
    except ValueError as error:
        raise InvalidUsage(f"{key} is not a key of a part staged by mvsink") from error


def _age_reference(key: str, last_modified: datetime | None) -> float:
    """When a part was staged: from its key, or its object timestamp for a foreign key."""
    try:
        return staged_at(key)
    except InvalidUsage:
        return last_modified.timestamp() if last_modified is not None else time.time()


def _versions(shard: Shard) -> dict[int, float]:
    """Retained version seqnos and their creation times (one LIST)."""
    objects = shard.client.list_objects(shard.bucket, prefix=f"{shard.prefix}/state/")
    return {
        int(o.object_name.rsplit("/", 1)[-1]): o.last_modified.timestamp()
        if o.last_modified is not None else time.time()
        for o in objects
    }  # fmt: skip


def _keys(shard: Shard, seqno: int) -> frozenset[str] | None:
    """Part keys of version `seqno` (cached: versions are immutable); None if pruned."""
    keys = shard.keys_of.get(seqno)
    if keys is None:
        state = shard.version(seqno)
        if state is None:
            return None
        keys = shard.keys_of[seqno] = state.part_keys
    return keys


def referenced_keys(shard: Shard) -> frozenset[str]:
    """Keys of every part referenced by any retained state version."""
    keys: set[str] = set()
    for seqno in sorted(_versions(shard)):
        found = _keys(shard, seqno)
        if found is not None:
            keys |= found
    return frozenset(keys)


def _remove(shard: Shard, keys: Iterable[str]) -> None:
    """Delete `keys` in batches of up to 1,000 (S3 DeleteObjects)."""
    keys = list(keys)
    for start in range(0, len(keys), 1000):
        batch = [DeleteObject(k) for k in keys[start : start + 1000]]
        errors = list(shard.client.remove_objects(shard.bucket, batch))
        if errors:
            raise MvsinkError(f"deleting from {shard.bucket}: {errors[:3]}")


def collect_garbage(shard: Shard) -> GcResult:
    """Rules 1 and 2 of the module docs. Cheap to call often: versions already seen are not
    read again.

    Steps: 1. LIST the retained versions with their creation times; 2. for each pair `(n, n+1)`
    with `n+1` older than `part_grace`, delete the parts `n` references and `n+1` does not;
    3. prune, oldest first, each version `n` whose successor is older than `version_grace` and
    whose pair step 2 has collected (so no part is left referenced by no retained version).
    """
    now = time.time()
    created = _versions(shard)
    seqnos = sorted(created)
    timing = shard.timing
    replaced: set[str] = set()
    through = shard.collected_through
    for older, newer in itertools.pairwise(seqnos):
        if newer != older + 1 or now - created[newer] <= timing.part_grace:
            break
        if newer <= shard.collected_through:
            continue
        before, after = _keys(shard, older), _keys(shard, newer)
        if before is None or after is None:
            break  # pruned meanwhile by another collector
        replaced |= before - after
        through = newer
    _remove(shard, sorted(replaced))
    shard.collected_through = through
    pruned = []
    for older, newer in itertools.pairwise(seqnos):
        if newer != older + 1 or now - created[newer] <= timing.version_grace:
            break
        if newer > through:
            break  # rule 1 has not deleted what `older` alone references: pruning it would leak
        shard.client.remove_object(shard.bucket, shard.state_key(older))
        shard.forget(older)
        pruned.append(older)
    return GcResult(tuple(sorted(replaced)), tuple(pruned), len(seqnos) - len(pruned))


def delete_staged(shard: Shard, parts: Iterable[PartRef]) -> DeleteResult:
    """Delete staged parts that can never be part of the shard; refuse the others.

    A part is deleted only if no retained state version references it *and* the upper has
    passed its `lower` (no compare-and-append for its bounds can succeed any more), the bounds
    being the ones its own footer records: a claim (a `StagedBatch` naming a part) is checked
    against them first, and a part whose footer disagrees is refused. Refused parts are
    reported, never deleted; a part already gone counts as deleted.
    """
    parts = tuple(parts)
    for part in parts:
        if not part.key.startswith(f"{shard.prefix}/parts/"):
            raise InvalidUsage(f"{part.key} is not a part of shard {shard.shard_id}")
    upper = shard.upper()
    referenced = referenced_keys(shard)
    deleted, kept, pending, mismatched = [], [], [], []
    for part in parts:
        if part.key in referenced:
            kept.append(part.key)
        elif not part.lower.less_than(upper):
            pending.append(part.key)
        elif _footer_bounds(shard, part.key) not in (None, (part.lower, part.upper)):
            mismatched.append(part.key)
        else:
            deleted.append(part.key)
    _remove(shard, deleted)
    return DeleteResult(tuple(deleted), tuple(kept), tuple(pending), tuple(mismatched))


#: How much of a part's end `_footer_bounds` reads first: its footer, in all but huge schemas.
FOOTER_TAIL = 1 << 16
#: The bounds of a file that records none: they match no claim (bounds are never empty).
NO_BOUNDS = (Frontier.empty(), Frontier.empty())


def _footer_bounds(shard: Shard, key: str) -> tuple[Frontier, Frontier] | None:
    """The `[lower, upper)` a part's Parquet footer records (`Shard.stage`), read from the
    part's last bytes; None if the part is gone; `NO_BOUNDS` for a file without them (not a
    part `stage` wrote)."""
    try:
        meta = footer_metadata(get_bytes(shard.client, shard.bucket, key, last=FOOTER_TAIL))
        if meta is None:  # a footer longer than the tail read
            meta = footer_metadata(get_bytes(shard.client, shard.bucket, key))
    except S3Error as error:
        if error.code == "NoSuchKey":
            return None
        raise
    except pa.ArrowException:
        return NO_BOUNDS
    if meta is None or b"mvsink.lower" not in meta or b"mvsink.upper" not in meta:
        return NO_BOUNDS
    try:
        return (Frontier.from_elements(json.loads(meta[b"mvsink.lower"])),
                Frontier.from_elements(json.loads(meta[b"mvsink.upper"])))  # fmt: skip
    except ValueError:  # not bounds `stage` wrote
        return NO_BOUNDS


def sweep(shard: Shard, grace: float) -> SweepResult:
    """`collect_garbage`, then rule 3: delete parts no retained version references, staged
    longer than `grace` ago.

    Raises:
        InvalidUsage: `grace < Timing.min_grace`.
    """
    if grace < shard.timing.min_grace:
        raise InvalidUsage(f"grace {grace}s is below the minimum {shard.timing.min_grace}s")
    collected = collect_garbage(shard)
    now = datetime.now(UTC).timestamp()
    referenced = referenced_keys(shard)
    leaked, young = [], 0
    objects = shard.client.list_objects(
        shard.bucket, prefix=f"{shard.prefix}/parts/", recursive=True
    )
    for obj in objects:
        if obj.object_name in referenced:
            continue
        if now - _age_reference(obj.object_name, obj.last_modified) <= grace:
            young += 1
            continue
        leaked.append(obj.object_name)
    _remove(shard, leaked)
    return SweepResult(tuple(leaked), young, len(referenced), collected.states_pruned)
