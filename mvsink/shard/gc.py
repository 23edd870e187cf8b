"""Deleting what no reader or writer can still use (persist's `gc.rs`), and nothing else.

Three kinds of garbage, three rules (the time bounds are `Timing`'s; they decide when
something is worth deleting, never whether deleting it is safe):

1. **Parts a merge replaced** (referenced by version `n`, not by `n+1`): such a key never returns
   (appends and merges take only fresh keys whose bounds the upper has not passed), so it is
   deleted once version `n+1` is older than `part_grace`, unless a live reader lease pins
   version `n` or an older one (`ReaderLease.seqno`, read from the newest version). A reader
   still reading an unpinned version `n` after that finds a part gone (`PartGone`) and starts
   over from the latest version, which holds the same contents at every frontier `>= since`;
   a pinning reader paused longer than its lease loses its pin the same way.
2. **Superseded state versions**: version `n` is pruned once `n+1` is older than
   `version_grace`, oldest first, one key after the other, never the latest. A writer that
   read `n` and paused may still create `n+1` after both were pruned; it cannot prove that
   create (`Shard._proven`), no reader takes it for a version (`Shard.state`), and this
   collector deletes it: the retained versions are the run from the newest object down linked
   by `prev`, and every object below it is such a stray (`_chain`). Parts a version dropped
   are deleted (1.) before that version is pruned, so pruning leaks nothing; pairs are taken
   only within the linked run (a stray may name a part its writer appended again later).
3. **Parts never referenced** (a writer died between staging and appending, a merge result
   that lost its race and whose deleter died): the sweeper deletes parts no retained version
   references once older than a grace `>= min_grace`, after moving the state's
   `sweep_horizon` past them (`sweep`): from that version on, no append or merge accepts them,
   however late it runs. `delete_staged` needs no clock: it deletes a part only when no
   retained version references it and the upper has passed the part's `lower` (by its own
   footer), after which no append for it can succeed.

A crash at any point leaves only garbage one of the rules above removes later.

The footers `delete_staged` reads also check a claim before it is appended (`claim_refusal`):
a `StagedBatch` names parts, and only parts that exist with the bounds it claims are appended.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from mvsink.core.errors import InvalidUsage
from mvsink.core.frontier import Frontier
from mvsink.core.settings import Timing
from mvsink.shard.blob import Blob, Clock, Listed
from mvsink.shard.parts import footer_metadata
from mvsink.shard.state import PartRef, ShardState, links, staged_at


class Shard(Protocol):
    """What the collector uses of a shard handle (`mvsink.shard.store.Shard`, which delegates
    its `collect_garbage`, `sweep`, `delete_staged` and `claim_refusal` here)."""

    blob: Blob
    clock: Clock
    shard_id: str
    timing: Timing
    prefix: str
    #: How many parts are read at once.
    read_threads: int
    #: What the collector read of each state object, by (seqno, etag): immutable.
    seen: dict[tuple[int, str], Seen]
    #: The newest version whose replaced parts this handle has deleted.
    collected_through: int

    def state_key(self, seqno: int) -> str: ...
    def version(
        self, seqno: int, etag: str | None = ..., cache: bool = ...
    ) -> ShardState | None: ...
    def forget(self, seqno: int) -> None: ...
    def state(self) -> ShardState: ...
    def upper(self) -> Frontier: ...
    def set_sweep_horizon(self, horizon: float) -> ShardState: ...


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


def _staged_or_none(key: str) -> float | None:
    """The staging time of a part key `Shard.stage` made; None for any other key (a foreign
    file, which can never be appended: aged by its object timestamp)."""
    try:
        return staged_at(key)
    except InvalidUsage:
        return None


def _versions(shard: Shard) -> dict[int, Listed]:
    """The state objects stored, by seqno (one LIST): versions, and any stray (`_chain`)."""
    return {int(o.key.rsplit("/", 1)[-1]): o for o in shard.blob.list(f"{shard.prefix}/state/")}


@dataclass(frozen=True)
class Seen:
    """What the collector needs of one state object (cached by seqno and etag: immutable)."""

    keys: frozenset[str]
    nonce: str
    prev: str
    #: `(seqno, expires_at)` of the leases pinning a version's parts (`ShardState.pins`).
    pins: tuple[tuple[int, float], ...] = ()


def _seen(shard: Shard, seqno: int, listed: Listed) -> Seen | None:
    """The object at `seqno` as listed; None if it is gone (or was replaced) since."""
    key = (seqno, listed.etag)
    seen = shard.seen.get(key)
    if seen is None:
        state = shard.version(seqno, listed.etag, cache=False)
        if state is None:
            return None
        seen = shard.seen[key] = Seen(state.part_keys, state.nonce, state.prev, state.pins())
    return seen


def _pinned(shard: Shard, seqnos: list[int], listed: dict[int, Listed], now: float) -> float:
    """The oldest version a live lease of the newest version pins (`ReaderLease.seqno`), or
    infinity: rule 1 deletes no part that version or a later one references. A lease expired
    by this collector's clock pins nothing (its reader paused longer than its lease and finds
    a part gone: `PartGone`)."""
    newest = _seen(shard, seqnos[-1], listed[seqnos[-1]]) if seqnos else None
    live = [seqno for seqno, expires_at in newest.pins if expires_at > now] if newest else []
    return min(live, default=float("inf"))


def referenced_keys(shard: Shard) -> frozenset[str]:
    """Keys of every part referenced by any state object stored, and by the latest version
    read after them (a version pruned between the LIST and its read has successors the LIST
    did not see: whatever they reference that is still live, the latest version does)."""
    keys: set[str] = set()
    for seqno, listed in sorted(_versions(shard).items()):
        seen = _seen(shard, seqno, listed)
        if seen is not None:
            keys |= seen.keys
    return frozenset(keys | shard.state().part_keys)


def _chain(shard: Shard, listed: dict[int, Listed]) -> list[int]:
    """The retained versions: from the newest object down, each one the one above links to
    (`mvsink.shard.state.links`). Below the first one that does not link (a
    pruned seqno a paused writer wrote again, `Shard._proven`) or below a gap confirmed by
    the missing key above it (a newer version existed when listed, so it was pruned, and
    everything below it before), every object is such a stray: deleted, its parts left to the
    sweeper (a live part is referenced by the chain too). An object gone since the LIST ends
    the chain there, deleting nothing."""
    seqnos = sorted(listed)
    if not seqnos:
        return []
    chain = [seqnos[-1]]
    newer = _seen(shard, seqnos[-1], listed[seqnos[-1]])
    strays: list[int] = []
    for position in range(len(seqnos) - 2, -1, -1):
        seqno = seqnos[position]
        if newer is None:
            return sorted(chain)
        if seqno != chain[-1] - 1:
            if shard.blob.stat(shard.state_key(chain[-1] - 1)) is None:
                strays = seqnos[: position + 1]
            break
        older = _seen(shard, seqno, listed[seqno])
        if older is None:
            break
        if not links(older.nonce, older.prev, newer.prev):
            strays = seqnos[: position + 1]
            break
        chain.append(seqno)
        newer = older
    for seqno in strays:
        shard.blob.remove([shard.state_key(seqno)])
        shard.forget(seqno)
    return sorted(chain)


def collect_garbage(shard: Shard) -> GcResult:
    """Rules 1 and 2 of the module docs. Cheap to call often: versions already seen are not
    read again.

    Steps: 1. LIST the retained versions with their creation times (deleting pruned seqnos
    written again, `_chain`); 2. for each pair `(n, n+1)` with `n+1` older than `part_grace`,
    delete the parts `n` references and `n+1` does not; 3. prune, oldest first, each version
    `n` whose successor is older than `version_grace` and whose pair step 2 has collected (so
    no part is left referenced by no retained version).
    """
    now = shard.clock.time()
    listed = _versions(shard)
    seqnos = _chain(shard, listed)
    created = {seqno: listed[seqno].modified for seqno in seqnos}
    for key in [k for k in shard.seen if seqnos and k[0] < seqnos[0]]:
        del shard.seen[key]  # pruned, by whichever collector
    timing = shard.timing
    replaced: set[str] = set()
    through = shard.collected_through
    pinned = _pinned(shard, seqnos, listed, now)
    for older, newer in itertools.pairwise(seqnos):
        if now - created[newer] <= timing.part_grace or older >= pinned:
            break
        if newer <= shard.collected_through:
            continue
        before, after = _seen(shard, older, listed[older]), _seen(shard, newer, listed[newer])
        if before is None or after is None:
            break  # pruned meanwhile by another collector
        replaced |= before.keys - after.keys
        through = newer
    shard.blob.remove(sorted(replaced))
    shard.collected_through = through
    pruned = []
    for older, newer in itertools.pairwise(seqnos):
        if now - created[newer] <= timing.version_grace:
            break
        if newer > through:
            break  # rule 1 has not deleted what `older` alone references: pruning it would leak
        shard.blob.remove([shard.state_key(older)])  # one by one, oldest first (`state`)
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
    shard.blob.remove(deleted)
    return DeleteResult(tuple(deleted), tuple(kept), tuple(pending), tuple(mismatched))


def claim_refusal(shard: Shard, parts: Iterable[PartRef]) -> str | None:
    """Why a claim -- a `StagedBatch` naming `parts` as staged for its bounds -- must not be
    appended, or None: each part lies under the shard's prefix, exists, and its own footer
    records the claimed bounds (`Shard.stage` writes them there). A claim is a hint, not the
    truth: appended, a key nobody staged fails every later read of the shard (`PartGone`), and
    real parts claimed for other bounds would put their updates at other times. One ranged GET
    per part younger than `max_part_age`, the parts read in parallel."""
    now, fresh = shard.clock.time(), []
    for part in parts:
        if not part.key.startswith(f"{shard.prefix}/parts/"):
            return f"part {part.key} is not a part of shard {shard.shard_id}"
        try:
            age = now - staged_at(part.key)
        except InvalidUsage as error:
            return str(error)
        # An older part is refused by its age when appended (`PartTooOld`), and one deleted
        # for its age (the sweep) is gone for that reason, not because nobody staged it.
        if age <= shard.timing.max_part_age:
            fresh.append(part)
    if not fresh:
        return None
    with ThreadPoolExecutor(max_workers=min(shard.read_threads, len(fresh))) as pool:
        found = list(pool.map(lambda part: _footer_bounds(shard, part.key), fresh))
    for part, bounds in zip(fresh, found, strict=True):
        if bounds is None:
            return f"part {part.key} does not exist"
        if bounds == NO_BOUNDS:
            return f"part {part.key} is no part a shard staged (its footer records no bounds)"
        if bounds != (part.lower, part.upper):
            return (
                f"part {part.key} was staged for [{bounds[0]}, {bounds[1]}), "
                f"not the claimed [{part.lower}, {part.upper})"
            )
    return None


#: How much of a part's end `_footer_bounds` reads first: its footer, in all but huge schemas.
FOOTER_TAIL = 1 << 16
#: The bounds of a file that records none: they match no claim (bounds are never empty).
NO_BOUNDS = (Frontier.empty(), Frontier.empty())


def _footer_bounds(shard: Shard, key: str) -> tuple[Frontier, Frontier] | None:
    """The `[lower, upper)` a part's Parquet footer records (`Shard.stage`), read from the
    part's last bytes; None if the part is gone; `NO_BOUNDS` for a file without them (not a
    part `stage` wrote)."""
    try:
        tail = shard.blob.get(key, last=FOOTER_TAIL)
        if tail is None:
            return None
        meta = footer_metadata(tail[0])
        if meta is None:  # a footer longer than the tail read
            whole = shard.blob.get(key)
            if whole is None:
                return None
            meta = footer_metadata(whole[0])
    except pa.ArrowException:
        return NO_BOUNDS
    if meta is None or b"mvsink.lower" not in meta or b"mvsink.upper" not in meta:
        return NO_BOUNDS
    try:
        return (
            Frontier.from_elements(json.loads(meta[b"mvsink.lower"])),
            Frontier.from_elements(json.loads(meta[b"mvsink.upper"])),
        )
    except ValueError:  # not bounds `stage` wrote
        return NO_BOUNDS


def sweep(shard: Shard, grace: float) -> SweepResult:
    """`collect_garbage`, then rule 3: delete parts no retained version references, staged
    longer than `grace` ago.

    Time-free safety: before deleting, the sweeper moves the state's `sweep_horizon` (one
    compare-and-set) to the staging time of the newest part it will delete, and reads what is
    referenced only after that version exists. Every later append or merge refuses parts
    staged before the horizon (`apply_append`, `apply_merge`), so a part found unreferenced
    then can never become referenced, however long the sweeper, or an appender that checked
    the part's age a while ago, pauses. `grace` (by this process's clock) only decides which
    parts are worth the horizon: a writer whose clock or pause makes its parts look older
    than that gets `PartTooOld` and stages again.

    Raises:
        InvalidUsage: `grace < Timing.min_grace`.
    """
    if grace < shard.timing.min_grace:
        raise InvalidUsage(f"grace {grace}s is below the minimum {shard.timing.min_grace}s")
    collected = collect_garbage(shard)
    referenced = referenced_keys(shard)
    now = shard.clock.time()
    candidates = [
        (o.key, _staged_or_none(o.key), o.modified)
        for o in shard.blob.list(f"{shard.prefix}/parts/", recursive=True)
        if o.key not in referenced
    ]
    old = [
        (key, staged)
        for key, staged, modified in candidates
        if now - (modified if staged is None else staged) > grace
    ]
    young = len(candidates) - len(old)
    ours = [staged for _, staged in old if staged is not None]
    if ours:
        horizon = max(ours) + 0.001
        if shard.state().sweep_horizon < horizon:
            shard.set_sweep_horizon(horizon)
        referenced = referenced_keys(shard)  # read after the horizon's version exists
    leaked = sorted(key for key, _ in old if key not in referenced)
    shard.blob.remove(leaked)
    return SweepResult(tuple(leaked), young, len(referenced), collected.states_pruned)
