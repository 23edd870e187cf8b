"""Shard state versions as data: immutable models and the pure functions that change them.

A state version is what `state/<seqno:020d>` holds (JSON). A change is computed by a pure
function from the previous version, in the manner of a commit-as-data table format: the I/O
shell (`mvsink.shard.store`) only reads a version, calls the function, and writes the result
conditionally. The changes:

* `apply_append`: one batch `[expected_upper, new_upper)` (possibly without parts);
* `apply_merge`: compare-and-merge, a contiguous run of live batches replaced by one batch
  holding the same updates with the times before `since` advanced and consolidated, made only
  if every input batch is still live (`None` otherwise: the merge lost a race);
* `apply_lease` / `apply_release`: a reader's hold on `since`, with an expiry, and (with the
  same change) named *critical holds*, which never expire (`apply_release_holds` drops them);
* `apply_retain_history`: how far `since` trails the upper;
* `apply_sweep_horizon`: the sweeper's fence: no part staged before it is added any more.

Every change also settles `since` (`settle`): expired leases are dropped and `since` advances to
the meet of `upper - retain_history`, every live lease's hold and every critical hold, never
backwards. A lease is for a reader that is running (it lapses when the reader goes away: a
crashed reader holds nothing for long); a critical hold is for durable state that a reader may
continue from after any pause (persist's critical `SinceHandle`, moved only explicitly): the
write service holds each desired partition's latest checkpoint with one, so a sink stopped for
longer than any lease still continues from its checkpoints. With
`retain_history = None` (a shard opened without a retention policy) `since` never advances.

Invariants of a chain of versions `0, 1, 2, ...` (checked by the functions):

1. `seqno` increases by exactly one from a version to the next;
2. `upper` never regresses, and an append moves it from exactly `expected_upper`;
3. the live `batches` are ordered and disjoint (each batch's `lower` is at or after the previous
   batch's `upper`; a gap is a stretch the upper crossed without data), every batch has
   `lower < upper`, and a part key, once dropped from the live batches, never returns;
4. `since <= upper` and `since` never regresses; no live lease and no critical hold holds below
   `since`;
5. for every frontier `as_of` with `since <= as_of <= upper`, the contents at `as_of` (updates
   with time `< as_of`, consolidated) are the same in every later version: merges only advance
   times before `since` and consolidate;
6. a version's size is O(live batches + leases + holds), not O(history);
7. `sweep_horizon` never regresses, and no part staged before it is added by the version or any
   later one.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from mvsink.core.errors import InvalidUsage, MvsinkError
from mvsink.core.frontier import Frontier
from mvsink.core.messages import Part, StagedBatch
from mvsink.core.settings import CompactionPolicy
from mvsink.core.updates import check_row_schema

#: The format written; format 1 (every batch ever appended, no leases) is still read.
FORMAT = 2
READS = (1, 2)


class PartTooOld(InvalidUsage):
    """A part staged before the shard's `sweep_horizon` (or longer ago than
    `Timing.max_part_age`, the writer's own early check): the sweeper may delete it, so it
    can never be appended."""


def staged_at(key: str) -> float:
    """Staging time (unix seconds) encoded in a part key `.../<unix_ms>-<uuid>.parquet`.

    Raises:
        InvalidUsage: not a key `Shard.stage` made.
    """
    name = key.rsplit("/", 1)[-1]
    try:
        return int(name.split("-", 1)[0]) / 1000.0
    except ValueError as error:
        raise InvalidUsage(f"{key} is not a key of a part staged by mvsink") from error


class SchemaMismatch(MvsinkError):
    """The shard exists with another row schema than the caller's."""


class AsOfBeforeSince(InvalidUsage):
    """A read or a hold at a frontier before the shard's `since`: the history it needs was
    compacted away (persist's `SnapshotErr::AsOfHistoricalDistinctionsLost`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PartRef(Part):
    """A staged part as a shard records it: the `Part` record (validated as one) with the bounds
    `[lower, upper)` it was staged for and its writer, which a `StagedBatch` carries once for
    all its parts. In a state version the bounds are its batch's, so the JSON form leaves them
    out; a `Part` without `partitioning` (states written before it existed) reads as 1.
    """

    lower: Frontier
    upper: Frontier
    writer_id: str

    def to_json(self) -> dict[str, Any]:
        """JSON form inside a state version (the bounds are the batch's)."""
        return {
            "key": self.key,
            "writer_id": self.writer_id,
            "updates": self.updates,
            "bytes": self.bytes,
            "partition": self.partition,
            "partitions_total": self.partitions_total,
            "partitioning": self.partitioning,
        }

    def to_message(self) -> Part:
        """The `Part` record that travels in a `StagedBatch` (bounds and writer go in the batch)."""
        return Part(
            self.key,
            self.partition,
            self.partitions_total,
            self.updates,
            self.bytes,
            self.partitioning,
        )

    @classmethod
    def from_transmittable(cls, part: Part, batch: StagedBatch) -> PartRef:
        """The part as staged, from its `StagedBatch` (the seed's
        `batch_from_transmittable_batch`)."""
        return cls(
            part.key,
            part.partition,
            part.partitions_total,
            part.updates,
            part.bytes,
            part.partitioning,
            lower=batch.lower,
            upper=batch.upper,
            writer_id=batch.writer_id,
        )

    @classmethod
    def from_json(cls, raw: dict[str, Any], lower: Frontier, upper: Frontier) -> PartRef:
        """Inverse of `to_json`, in a batch `[lower, upper)`."""
        return cls(
            raw["key"],
            raw["partition"],
            raw["partitions_total"],
            raw["updates"],
            raw["bytes"],
            raw.get("partitioning", 1),
            lower=lower,
            upper=upper,
            writer_id=raw["writer_id"],
        )


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """One live batch: its bounds, the version that made it (appended or merged), its parts."""

    lower: Frontier
    upper: Frontier
    seqno: int
    parts: tuple[PartRef, ...]

    @property
    def updates(self) -> int:
        """Updates in its parts."""
        return sum(p.updates for p in self.parts)

    @property
    def bytes(self) -> int:
        """Bytes of its parts."""
        return sum(p.bytes for p in self.parts)

    def to_json(self) -> dict[str, Any]:
        """JSON form inside a state version."""
        return {
            "lower": self.lower.elements(),
            "upper": self.upper.elements(),
            "seqno": self.seqno,
            "parts": [p.to_json() for p in self.parts],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> BatchRecord:
        """Inverse of `to_json` (format 1 parts carry their own bounds)."""
        lower = Frontier.from_elements(raw["lower"])
        upper = Frontier.from_elements(raw["upper"])
        parts = tuple(
            PartRef.from_json(
                p,
                Frontier.from_elements(p.get("lower", raw["lower"])),
                Frontier.from_elements(p.get("upper", raw["upper"])),
            )
            for p in raw["parts"]
        )
        return cls(lower, upper, raw["seqno"], parts)


@dataclass(frozen=True, slots=True)
class ReaderLease:
    """A reader's hold: `since` does not pass `since` while the lease lives (until
    `expires_at`, unix seconds). Renewed and moved forward by `apply_lease`. A lease with a
    `seqno` (persist's seqno hold) also pins the parts of that version: while it lives, the
    collector deletes no part that version references (`gc.collect_garbage`), so a reader that
    reads those parts over a long job (`mvsink.shard.spark`) never finds one gone."""

    reader_id: str
    since: Frontier
    expires_at: float
    seqno: int | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON form inside a state version (`seqno` only when pinned: older readers skip it)."""
        document: dict[str, Any] = {
            "reader_id": self.reader_id,
            "since": self.since.elements(),
            "expires_at": self.expires_at,
        }
        if self.seqno is not None:
            document["seqno"] = self.seqno
        return document

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ReaderLease:
        """Inverse of `to_json`."""
        return cls(
            raw["reader_id"],
            Frontier.from_elements(raw["since"]),
            raw["expires_at"],
            raw.get("seqno"),
        )


@dataclass(frozen=True, slots=True)
class CriticalHold:
    """A hold on `since` that never expires: `since` does not pass `since` until the holder
    moves it (`apply_lease(..., holds=...)`, forward only) or drops it (`apply_release_holds`).
    Its holder is durable state rather than a process (persist's critical reader): e.g.
    `checkpoint:<sink>:p<N>`, a write task's latest correction checkpoint."""

    holder_id: str
    since: Frontier

    def to_json(self) -> dict[str, Any]:
        """JSON form inside a state version."""
        return {"holder_id": self.holder_id, "since": self.since.elements()}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> CriticalHold:
        """Inverse of `to_json`."""
        return cls(raw["holder_id"], Frontier.from_elements(raw["since"]))


@dataclass(frozen=True, slots=True)
class MergeRequest:
    """A planned merge: the contiguous run of live batches `inputs`, to be replaced by one
    batch `[inputs[0].lower, inputs[-1].upper)` whose updates are the inputs' with every time
    before `min(since, upper)` advanced to the last time before it, consolidated. Outputs are
    one part per desired partition under `partitions_total` and function `partitioning` (one
    part if `partitions_total` is `None`)."""

    inputs: tuple[BatchRecord, ...]
    since: Frontier
    partitions_total: int | None
    reason: str
    partitioning: int = 1

    def __post_init__(self) -> None:
        if not self.inputs:
            raise InvalidUsage("a merge needs at least one input batch")

    @property
    def lower(self) -> Frontier:
        """Lower of the merged batch."""
        return self.inputs[0].lower

    @property
    def upper(self) -> Frontier:
        """Upper of the merged batch."""
        return self.inputs[-1].upper

    @property
    def advance_before(self) -> Frontier:
        """Times before this frontier are advanced to the last time before it."""
        return self.since.meet(self.upper)

    @property
    def input_keys(self) -> frozenset[str]:
        """Keys of every input part."""
        return frozenset(p.key for b in self.inputs for p in b.parts)

    @property
    def updates(self) -> int:
        """Updates in the inputs."""
        return sum(b.updates for b in self.inputs)

    @property
    def bytes(self) -> int:
        """Bytes of the inputs."""
        return sum(b.bytes for b in self.inputs)


@dataclass(frozen=True)
class ShardState:
    """One version of a shard's state.

    `batches` holds the live batches with data (empty appends only move `upper`; merged inputs
    are gone); `change` names what this version did (`create`, `append`, `merge`, `lease`,
    `release`, `retain`, `sweep`); `appended` is the batch an `append` version appended (possibly
    without parts). `nonce` makes the bytes of every written version unique to its writer's
    attempt, so a retried conditional create can be recognised as its own (see `mvsink.io.s3`).
    """

    shard_id: str
    seqno: int
    upper: Frontier
    since: Frontier
    schema: pa.Schema
    batches: tuple[BatchRecord, ...] = ()
    appended: BatchRecord | None = None
    nonce: str = ""
    #: The nonce of the version this one was computed from ("" for version 0 and versions
    #: written before it was recorded): a version is the successor of the one before it
    #: only if this links them (`links`).
    prev: str = ""
    #: How far `since` trails the upper, in times; `None`: `since` never advances.
    retain_history: int | None = None
    readers: tuple[ReaderLease, ...] = ()
    #: Critical holds, sorted by holder (no expiry: moved or dropped only explicitly).
    holds: tuple[CriticalHold, ...] = ()
    #: Parts staged before this unix time can no longer be added (`apply_sweep_horizon`).
    sweep_horizon: float = 0.0
    change: str = "create"
    _part_keys: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def __post_init__(self) -> None:
        keys = frozenset(p.key for b in self.batches for p in b.parts)
        object.__setattr__(self, "_part_keys", keys)

    @property
    def part_keys(self) -> frozenset[str]:
        """Keys of every part this version references."""
        return self._part_keys

    def parts(self) -> list[PartRef]:
        """Every part this version references, in batch order."""
        return [p for b in self.batches for p in b.parts]

    def total_bytes(self) -> int:
        """Sum of the referenced parts' sizes."""
        return sum(b.bytes for b in self.batches)

    def total_updates(self) -> int:
        """Sum of the referenced parts' update counts."""
        return sum(b.updates for b in self.batches)

    def lease(self, reader_id: str) -> ReaderLease | None:
        """The lease of `reader_id`, if it holds one."""
        return next((r for r in self.readers if r.reader_id == reader_id), None)

    def pins(self) -> tuple[tuple[int, float], ...]:
        """`(seqno, expires_at)` of each lease that pins a version's parts."""
        return tuple((r.seqno, r.expires_at) for r in self.readers if r.seqno is not None)

    def hold(self, holder_id: str) -> CriticalHold | None:
        """The critical hold of `holder_id`, if it has one."""
        return next((h for h in self.holds if h.holder_id == holder_id), None)

    # -- serialisation ----------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """The JSON document stored at `state/<seqno>`."""
        document = {
            "format": FORMAT,
            "shard_id": self.shard_id,
            "seqno": self.seqno,
            "upper": self.upper.elements(),
            "since": self.since.elements(),
            "retain_history": self.retain_history,
            "schema": schema_to_json(self.schema),
            "batches": [b.to_json() for b in self.batches],
            "readers": [r.to_json() for r in self.readers],
            "change": self.change,
            "appended": None if self.appended is None else self.appended.to_json(),
            "nonce": self.nonce,
        }
        if self.holds:  # absent when empty: versions without holds keep their earlier form
            document["holds"] = [h.to_json() for h in self.holds]
        if self.sweep_horizon:  # absent when never set, as `holds`
            document["sweep_horizon"] = self.sweep_horizon
        if self.prev:
            document["prev"] = self.prev
        return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ShardState:
        """Parse a stored state version (format 1 or 2).

        Raises:
            MvsinkError: not a state document of a format this code reads.
        """
        try:
            raw = json.loads(data)
            if raw.get("format") not in READS:
                raise MvsinkError(f"shard state format {raw.get('format')!r} is not one of {READS}")
            return cls(
                shard_id=raw["shard_id"],
                seqno=raw["seqno"],
                upper=Frontier.from_elements(raw["upper"]),
                since=Frontier.from_elements(raw["since"]),
                schema=schema_from_json(raw["schema"]),
                batches=tuple(BatchRecord.from_json(b) for b in raw["batches"]),
                appended=None
                if raw["appended"] is None
                else BatchRecord.from_json(raw["appended"]),
                nonce=raw["nonce"],
                retain_history=raw.get("retain_history"),
                readers=tuple(ReaderLease.from_json(r) for r in raw.get("readers", [])),
                holds=tuple(CriticalHold.from_json(h) for h in raw.get("holds", [])),
                sweep_horizon=float(raw.get("sweep_horizon", 0.0)),
                prev=raw.get("prev", ""),
                change=raw.get("change", "append" if raw["appended"] is not None else "create"),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise MvsinkError(f"corrupt shard state document: {error!r}") from error


def initial_state(
    shard_id: str, schema: pa.Schema, nonce: str, retain_history: int | None = None
) -> ShardState:
    """Version 0: `upper = since = {0}`, no batches."""
    check_row_schema(schema)
    _check_retain(retain_history)
    return ShardState(
        shard_id,
        0,
        Frontier.minimum(),
        Frontier.minimum(),
        schema,
        nonce=nonce,
        retain_history=retain_history,
    )


# -- since ------------------------------------------------------------------------------------


def since_target(state: ShardState, now: float) -> Frontier:
    """Where `since` may go now: the meet of `upper - retain_history`, every live lease's hold
    and every critical hold, never before the current `since`. A closed upper (`{}`) keeps
    `since` where it is."""
    if state.retain_history is None or state.upper.time is None:
        return state.since
    target = Frontier.at(max(0, state.upper.time - state.retain_history))
    for lease in state.readers:
        if lease.expires_at > now:
            target = target.meet(lease.since)
    for hold in state.holds:
        target = target.meet(hold.since)
    return state.since.join(target)


def settle(state: ShardState, now: float) -> ShardState:
    """Drop expired leases and advance `since` (invariant 4). Part of every change."""
    readers = tuple(r for r in state.readers if r.expires_at > now)
    settled = replace(state, readers=readers)
    return replace(settled, since=since_target(settled, now))


def _successor(
    state: ShardState, change: str, nonce: str, now: float, **changes: Any
) -> ShardState:
    following = replace(
        state,
        seqno=state.seqno + 1,
        change=change,
        appended=None,
        nonce=nonce,
        prev=state.nonce,
        **changes,
    )
    return settle(following, now)


def links(older_nonce: str, older_prev: str, newer_prev: str) -> bool:
    """Whether the version whose `prev` is `newer_prev` was computed from the one before it
    (nonce `older_nonce`, its own `prev` `older_prev`): an object at a pruned seqno that a
    paused writer wrote again links to nothing retained. Two versions both written before
    `prev` was recorded count as linked (a stray always records one)."""
    return newer_prev == older_nonce if newer_prev else not older_prev


# -- changes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Appended:
    """The append happened: the shard's upper is now `new_upper`, at version `seqno`."""

    new_upper: Frontier
    seqno: int


@dataclass(frozen=True)
class UpperMismatch:
    """The shard's upper was `current` (at version `seqno`), not the expected upper: another
    writer moved it first (an expected outcome under concurrent writers, not an error)."""

    current: Frontier
    seqno: int


#: The outcome of a compare-and-append (`Shard.compare_and_append`).
AppendResult = Appended | UpperMismatch


def apply_append(
    state: ShardState,
    parts: tuple[PartRef, ...],
    expected_upper: Frontier,
    new_upper: Frontier,
    nonce: str,
    now: float = 0.0,
) -> ShardState:
    """The version after appending `parts` as one batch `[expected_upper, new_upper)`.

    The caller has checked `state.upper == expected_upper` (a mismatch is an expected outcome,
    not an error). Raises `InvalidUsage` for anything that could never be appended.
    """
    if state.upper != expected_upper:
        raise InvalidUsage(f"apply_append on upper {state.upper}, expected {expected_upper}")
    if not expected_upper.less_than(new_upper):
        raise InvalidUsage(f"append bounds [{expected_upper}, {new_upper}) are empty")
    for part in parts:
        if (part.lower, part.upper) != (expected_upper, new_upper):
            raise InvalidUsage(
                f"part {part.key} was staged for [{part.lower}, {part.upper}), "
                f"not [{expected_upper}, {new_upper})"
            )
    keys = [p.key for p in parts]
    if len(set(keys)) != len(keys) or state.part_keys & set(keys):
        raise InvalidUsage(f"a part is appended twice: {sorted(keys)}")
    _check_horizon(state, parts)
    batch = BatchRecord(expected_upper, new_upper, state.seqno + 1, parts)
    batches = (*state.batches, batch) if parts else state.batches
    following = _successor(state, "append", nonce, now, upper=new_upper, batches=batches)
    return replace(following, appended=batch)


def apply_merge(
    state: ShardState, request: MergeRequest, parts: tuple[PartRef, ...], nonce: str, now: float
) -> ShardState | None:
    """Compare-and-merge: the version with `request.inputs` replaced by one batch of `parts`,
    or `None` if the inputs are no longer all live (another merge took some: the result must
    be discarded).

    Raises:
        InvalidUsage: outputs staged for other bounds, or reusing a key.
    """
    position = _find_run(state.batches, request.inputs)
    if position is None:
        return None
    for part in parts:
        if (part.lower, part.upper) != (request.lower, request.upper):
            raise InvalidUsage(
                f"merge output {part.key} was staged for [{part.lower}, "
                f"{part.upper}), not [{request.lower}, {request.upper})"
            )
    keys = [p.key for p in parts]
    if len(set(keys)) != len(keys) or state.part_keys & set(keys):
        raise InvalidUsage(f"a merge output reuses a part key: {sorted(keys)}")
    _check_horizon(state, parts)
    merged = BatchRecord(request.lower, request.upper, state.seqno + 1, parts)
    end = position + len(request.inputs)
    batches = (*state.batches[:position], *((merged,) if parts else ()), *state.batches[end:])
    return _successor(state, "merge", nonce, now, batches=batches)


def _check_horizon(state: ShardState, parts: tuple[PartRef, ...]) -> None:
    """Refuse parts the sweeper may have deleted (`apply_sweep_horizon`); once there is a
    horizon, also keys `Shard.stage` did not make (their age is unknown)."""
    if not state.sweep_horizon:
        return
    for part in parts:
        if staged_at(part.key) < state.sweep_horizon:
            raise PartTooOld(
                f"part {part.key} was staged before the shard's sweep horizon "
                f"{state.sweep_horizon:.3f}: the sweeper may delete it"
            )


def apply_sweep_horizon(state: ShardState, horizon: float, nonce: str, now: float) -> ShardState:
    """The version after which no part staged before `horizon` (unix seconds, by its key) is
    added by any append or merge: the sweeper sets it before deleting unreferenced parts
    staged before it, so none it deletes can become referenced later, whatever pauses (never
    moved backwards)."""
    return _successor(state, "sweep", nonce, now, sweep_horizon=max(state.sweep_horizon, horizon))


def _find_run(batches: tuple[BatchRecord, ...], inputs: tuple[BatchRecord, ...]) -> int | None:
    """Where the run `inputs` starts in `batches` (every input still live, same parts)."""
    for position, batch in enumerate(batches):
        if batch == inputs[0]:
            return position if batches[position : position + len(inputs)] == inputs else None
    return None


def apply_lease(
    state: ShardState,
    reader_id: str,
    hold: Frontier | None,
    expires_at: float,
    nonce: str,
    now: float,
    holds: Mapping[str, Frontier] | None = None,
    pin: bool = False,
) -> ShardState:
    """Take or renew `reader_id`'s lease until `expires_at`, holding `since` at `hold` (at the
    current `since` if `None`; a renewal never moves a hold backwards), and in the same version
    move the critical holds named in `holds` forward to their frontiers (a new one is taken at
    `since` or later: history before `since` is gone, and its holder finds that out by reading
    `since`; one never moves backwards). With `pin`, a lease taken now pins the parts of the
    version this change writes (`ReaderLease.seqno`), and a renewal keeps the seqno it pinned;
    a lease that expired is a new one, pinning the new version (its reader compares seqnos to
    tell that its own pin lapsed).

    Raises:
        AsOfBeforeSince: `hold` is before `since` (that history is gone) or the lease expired
            and `since` passed its hold.
        InvalidUsage: an empty reader id, or an expiry not after `now`.
    """
    if not reader_id:
        raise InvalidUsage("a reader lease needs a reader id")
    if expires_at <= now:
        raise InvalidUsage(f"lease of {reader_id} would expire at {expires_at}, not after {now}")
    settled = settle(state, now)
    current = settled.lease(reader_id)
    wanted = hold if hold is not None else current.since if current else settled.since
    if current is not None:
        wanted = current.since.join(wanted)
    if not settled.since.less_equal(wanted):
        raise AsOfBeforeSince(
            f"reader {reader_id} cannot hold {wanted}: shard {state.shard_id} "
            f"is compacted to since {settled.since}"
        )
    pinned = None
    if pin:
        pinned = current.seqno if current and current.seqno is not None else settled.seqno + 1
    readers = (
        *(r for r in settled.readers if r.reader_id != reader_id),
        ReaderLease(reader_id, wanted, expires_at, pinned),
    )
    return _successor(
        settled, "lease", nonce, now, readers=readers, holds=_moved_holds(settled, holds or {})
    )


def _moved_holds(state: ShardState, moves: Mapping[str, Frontier]) -> tuple[CriticalHold, ...]:
    """`state.holds` with each of `moves` joined in (and at `since` or later)."""
    held = {h.holder_id: h.since for h in state.holds}
    for holder_id, frontier in moves.items():
        if not holder_id:
            raise InvalidUsage("a critical hold needs a holder id")
        held[holder_id] = held.get(holder_id, state.since).join(frontier).join(state.since)
    return tuple(CriticalHold(h, f) for h, f in sorted(held.items()))


def apply_set_holds(
    state: ShardState, holds: Mapping[str, Frontier], nonce: str, now: float
) -> ShardState:
    """Set the critical holds of `holds` to exactly their frontiers, backwards too (a repaired
    checkpoint that starts before where the old one was held).

    Raises:
        AsOfBeforeSince: a frontier before `since` (that history is gone).
    """
    settled = settle(state, now)
    for holder_id, frontier in holds.items():
        if not holder_id:
            raise InvalidUsage("a critical hold needs a holder id")
        if not settled.since.less_equal(frontier):
            raise AsOfBeforeSince(
                f"{holder_id} cannot hold {frontier}: shard {state.shard_id} "
                f"is compacted to since {settled.since}"
            )
    held = {h.holder_id: h.since for h in settled.holds} | dict(holds)
    return _successor(
        settled,
        "lease",
        nonce,
        now,
        holds=tuple(CriticalHold(h, f) for h, f in sorted(held.items())),
    )


def apply_release_holds(
    state: ShardState, holder_ids: Iterable[str], nonce: str, now: float
) -> ShardState:
    """Drop the critical holds of `holder_ids` (a sink dropped, or its checkpoints deleted and
    repaired elsewhere): `since` may then pass where they held it."""
    dropped = set(holder_ids)
    holds = tuple(h for h in state.holds if h.holder_id not in dropped)
    return _successor(state, "release", nonce, now, holds=holds)


def apply_release(state: ShardState, reader_id: str, nonce: str, now: float) -> ShardState:
    """Drop `reader_id`'s lease (a no-op change if it holds none)."""
    readers = tuple(r for r in state.readers if r.reader_id != reader_id)
    return _successor(state, "release", nonce, now, readers=readers)


def apply_retain_history(
    state: ShardState, retain_history: int | None, nonce: str, now: float
) -> ShardState:
    """Set how far `since` trails the upper (`None`: keep all history from now on)."""
    _check_retain(retain_history)
    return _successor(state, "retain", nonce, now, retain_history=retain_history)


def _check_retain(retain_history: int | None) -> None:
    if retain_history is not None and (isinstance(retain_history, bool) or retain_history < 0):
        raise InvalidUsage(f"retain_history must be >= 0 or None, got {retain_history!r}")


# -- readers ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SelectedPart:
    """A part a reader of some partition must read, and whether its rows must be filtered by
    partition (its partitioning is unknown or differs from the reader's)."""

    part: PartRef
    needs_filter: bool


def select_parts(
    batches: tuple[BatchRecord, ...],
    partition: int | None,
    partitions_total: int | None,
    partitioning: int,
) -> list[SelectedPart]:
    """Parts of `batches` that hold updates of desired `partition` under P =
    `partitions_total` and function `partitioning` (every part, unfiltered, if `partition` is
    None)."""
    selected = []
    for part in (p for b in batches for p in b.parts):
        if partition is None:
            selected.append(SelectedPart(part, needs_filter=False))
        elif (
            part.partition is None
            or part.partitions_total != partitions_total
            or part.partitioning != partitioning
        ):
            selected.append(SelectedPart(part, needs_filter=True))
        elif part.partition == partition:
            selected.append(SelectedPart(part, needs_filter=False))
    return selected


def overlapping(
    batches: tuple[BatchRecord, ...], lower: Frontier, upper: Frontier
) -> tuple[BatchRecord, ...]:
    """The batches holding updates at times in `[lower, upper)`."""
    return tuple(b for b in batches if b.lower.less_than(upper) and lower.less_than(b.upper))


# -- merge policy -----------------------------------------------------------------------------


def maybe_merge(state: ShardState, policy: CompactionPolicy) -> MergeRequest | None:
    """The merge the shard needs now, if any: a size-tiered policy (RocksDB's and Paimon's
    universal compaction) that keeps live batches logarithmic in history and bytes bounded.

    Over the live batches, oldest first, sizes in updates; *passed* are the batches whose upper
    is at most `since` (a merge advances their times to one, so churn among them collapses),
    the others keep their times distinct, so merging them in only rewrites them:

    1. amplification: the newer passed batches together reach `max_amplification` times the
       oldest -> merge the passed ones (this collapses churn back to the size of the view);
    2. size ratio: from the newest passed batch, take older batches while each is at most
       `1 + size_ratio` times the run so far; a run of `min_merge` or more -> merge it. When
       `max_batches - min_merge` or more batches are not passed (`since` held back, or kept
       still with `retain_history` unset), the run starts from the newest batch instead;
    3. count: more than `max_batches` -> merge the adjacent run of the smallest total size that
       brings the count back to `max_batches`.

    Rules 1 and 2 wait for `since` (a write driver's lease trails its folds by about a second,
    `services.write.shell.HOLD_INTERVAL`): a merge consolidates only the times it advances, so
    input past `since` is rewritten as it is; waiting, every merge collapses churn to the view.
    """
    batches = state.batches
    if len(batches) < 2:
        return None
    sizes = [max(b.updates, 1) for b in batches]
    passed = sum(1 for b in batches if b.upper.less_equal(state.since))
    if passed >= 2 and sum(sizes[1:passed]) >= policy.max_amplification * sizes[0]:
        return _request(state, batches[:passed], "amplification")
    end = passed if len(batches) - passed < policy.max_batches - policy.min_merge else len(batches)
    if end:
        start, total = end - 1, sizes[end - 1]
        while start > 0 and sizes[start - 1] <= total * (1 + policy.size_ratio):
            start -= 1
            total += sizes[start]
        if end - start >= policy.min_merge:
            return _request(state, batches[start:end], "size ratio")
    if len(batches) > policy.max_batches:
        width = len(batches) - policy.max_batches + 1
        best = min(range(len(batches) - width + 1), key=lambda i: sum(sizes[i : i + width]))
        return _request(state, batches[best : best + width], "count")
    return None


def merge_all(state: ShardState) -> MergeRequest | None:
    """A merge of every live batch (a forced compaction), if there is anything to gain: two or
    more batches, or one whose times before `since` may still be consolidated."""
    if not state.batches or (len(state.batches) == 1 and state.since == Frontier.minimum()):
        return None
    return _request(state, state.batches, "forced")


def _request(state: ShardState, inputs: tuple[BatchRecord, ...], reason: str) -> MergeRequest:
    """Outputs keep the partitioning most of the input updates have (foreign parts are split
    by row hash into it), so a write task still reads only its own partition."""
    weights: dict[tuple[int, int], int] = {}
    for part in (p for b in inputs for p in b.parts):
        if part.partitions_total is not None:
            kind = (part.partitions_total, part.partitioning)
            weights[kind] = weights.get(kind, 0) + part.updates + 1
    if not weights:
        return MergeRequest(inputs, state.since, None, reason)
    total, partitioning = max(weights, key=lambda k: weights[k])
    return MergeRequest(inputs, state.since, total, reason, partitioning)


def schema_to_json(schema: pa.Schema) -> dict[str, Any]:
    """Readable field list plus the exact Arrow IPC form."""
    return {
        "fields": [[f.name, str(f.type), f.nullable] for f in schema],
        "arrow_ipc": base64.b64encode(schema.serialize().to_pybytes()).decode(),
    }


def schema_from_json(raw: dict[str, Any]) -> pa.Schema:
    """Inverse of `schema_to_json`."""
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(raw["arrow_ipc"])))


def same_schema(a: pa.Schema, b: pa.Schema) -> bool:
    """Whether two row schemas are the same (names, types, nullability; metadata ignored)."""
    return bool(a.remove_metadata().equals(b.remove_metadata()))
