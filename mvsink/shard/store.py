"""The shard on object storage: staging parts, compare-and-append, readers, safe deletion.

See the package docs (`mvsink.shard`) for the layout and the linearizability argument. This
module is the I/O shell: it reads state versions, calls the pure functions of
`mvsink.shard.state`, and writes the result with one conditional create.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from minio import Minio

from mvsink.core.errors import InvalidUsage, MvsinkError
from mvsink.core.frontier import Frontier
from mvsink.core.partitioning import CURRENT, partitions_of
from mvsink.core.settings import S3Settings, Timing
from mvsink.core.updates import normalize_updates, part_schema
from mvsink.io.s3 import IndefiniteWrite, PreconditionFailed, Written
from mvsink.shard import gc
from mvsink.shard import parts as partio
from mvsink.shard.blob import SYSTEM, Blob, Clock, Listed, MinioBlob, unquoted
from mvsink.shard.gc import DeleteResult, GcResult, SweepResult
from mvsink.shard.state import (
    Appended,
    AppendResult,
    AsOfBeforeSince,
    BatchRecord,
    MergeRequest,
    PartRef,
    PartTooOld,
    ReaderLease,
    SchemaMismatch,
    SelectedPart,
    ShardState,
    UpperMismatch,
    apply_append,
    apply_lease,
    apply_merge,
    apply_release,
    apply_release_holds,
    apply_retain_history,
    apply_set_holds,
    apply_sweep_horizon,
    initial_state,
    overlapping,
    same_schema,
    select_parts,
    staged_at,
)

PARQUET = "application/vnd.apache.parquet"
_STATE_CACHE = 16
_INDEFINITE_RETRIES = 5
_Outcome = TypeVar("_Outcome")
#: How often a read starts over from the latest version when a merge replaced its parts.
_READ_ATTEMPTS = 5


@dataclass(frozen=True)
class Merged:
    """The merge replaced its inputs: `batch` is live from version `seqno`."""

    batch: BatchRecord
    seqno: int


@dataclass(frozen=True)
class MergeRefused:
    """An input was no longer live at version `seqno` (another merge took it): the result was
    discarded and its parts deleted. (A merge whose create landed but could not be proven,
    `Shard._proven`, also reads as refused: it is in the shard, and `delete_staged` keeps its
    outputs, which are referenced.)"""

    seqno: int


MergeResult = Merged | MergeRefused


class IndefiniteAppend(MvsinkError):
    """A compare-and-append whose outcome is unknown; re-read the state to learn it."""


class ShardNotFound(MvsinkError):
    """A shard opened without a schema (to read or maintain it) does not exist."""


class PartGone(MvsinkError):
    """A part of the version a reader was reading is gone: a merge replaced it and the
    garbage collector deleted it. Read the latest version again."""


class Shard:
    """A handle on one shard. Thread-safe for readers; one handle may append from one thread at
    a time (use one handle per writer, as independent processes would)."""

    def __init__(
        self,
        client: Minio | None,
        bucket: str,
        shard_id: str,
        schema: pa.Schema,
        timing: Timing,
        *,
        blob: Blob | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        if blob is None:
            if client is None:
                raise InvalidUsage("a shard needs a MinIO client or a blob")
            blob = MinioBlob(client, bucket)
        self.client = client
        self.bucket = bucket
        self.blob = blob
        self.clock = clock
        self.shard_id = shard_id
        self.schema = schema
        self.timing = timing
        self.prefix = f"shards/{shard_id}"
        self._states: OrderedDict[int, tuple[ShardState, str]] = OrderedDict()
        #: The latest version this handle saw, and the etag of the object it read there.
        self._latest: int | None = None
        self._latest_etag = ""
        #: What the collector read of each state object, by (seqno, etag): immutable.
        self.seen: dict[tuple[int, str], gc.Seen] = {}
        #: Where the shard lives, for work shipped to other processes (set by `open_shard`).
        self.s3: S3Settings | None = None
        #: The newest version whose replaced parts this handle has deleted.
        self.collected_through = -1
        #: How many parts `read_parts` reads at once (1: one after the other, on this thread).
        self.read_threads = 8

    # -- keys -------------------------------------------------------------------------------

    def state_key(self, seqno: int) -> str:
        """Object key of state version `seqno`."""
        return f"{self.prefix}/state/{seqno:020d}"

    def _part_key(self, writer_id: str) -> str:
        staged = int(self.clock.time() * 1000)
        return f"{self.prefix}/parts/{writer_id}/{staged}-{uuid.uuid4().hex}.parquet"

    # -- state versions ---------------------------------------------------------------------

    def version(self, seqno: int, etag: str | None = None, cache: bool = True) -> ShardState | None:
        """State version `seqno`, or None if it does not exist (yet, or any more). With `etag`
        (from a LIST): None also if the object there now has other bytes (the version was
        pruned and its key written again, `_create_version`). `cache=False` reads without
        keeping it (the collector, which may read strays, keeps what it needs itself)."""
        cached = self._states.get(seqno)
        if cached is not None and (etag is None or cached[1] == etag):
            return cached[0]
        found = self.blob.get(self.state_key(seqno))
        if found is None or (etag is not None and found[1] != etag):
            return None
        state = ShardState.from_bytes(found[0])
        if state.seqno != seqno or state.shard_id != self.shard_id:
            raise MvsinkError(
                f"{self.state_key(seqno)} holds seqno {state.seqno} of shard {state.shard_id}"
            )
        if cache:
            self._remember(state, found[1])
        return state

    def _remember(self, state: ShardState, etag: str) -> None:
        self._states[state.seqno] = (state, etag)
        while len(self._states) > _STATE_CACHE:
            self._states.popitem(last=False)

    def forget(self, seqno: int) -> None:
        """Drop what is cached of version `seqno` (it was pruned)."""
        self._states.pop(seqno, None)

    def retained_seqnos(self) -> list[int]:
        """Seqnos of the state versions currently stored, ascending (one LIST)."""
        return [_seqno(o.key) for o in self.blob.list(f"{self.prefix}/state/")]

    def state(self) -> ShardState:
        """The latest state version: one LIST of the versions after the last one seen.

        Linearizable read, whatever pauses: the newest key a LIST returns was the latest
        version while the LIST ran (versions are created strictly in seqno order, and the
        latest is never pruned), and its bytes are used only if they still have the etag the
        LIST saw (a key pruned since and written again by a paused writer holds other bytes, or
        that version's own, byte for byte: `_proven`). An empty
        LIST after the last version seen proves that version is still the latest: a version
        is pruned only once it has a successor, which the LIST would have returned.
        """
        while True:
            after = "" if self._latest is None else self.state_key(self._latest)
            listed = self.blob.list(f"{self.prefix}/state/", start_after=after)
            if not listed:
                if self._latest is None:
                    raise MvsinkError(f"shard {self.shard_id} does not exist in {self.bucket}")
                state = self.version(self._latest, self._latest_etag)
                if state is not None:
                    return state
                self._latest = None  # pruned and evicted from the cache: find the latest again
                continue
            newest = listed[-1]
            state = self.version(_seqno(newest.key), newest.etag)
            if state is not None:
                self._latest, self._latest_etag = state.seqno, newest.etag
                return state

    def upper(self) -> Frontier:
        """The shard's current upper: all times before it are final."""
        return self.state().upper

    # -- writing ----------------------------------------------------------------------------

    def stage(
        self,
        updates: pa.Table | pa.RecordBatch,
        lower: Frontier,
        upper: Frontier,
        writer_id: str,
        partition: int | None = None,
        partitions_total: int | None = None,
        partitioning: int = CURRENT,
    ) -> PartRef:
        """Write one Parquet part of `updates` for the batch `[lower, upper)`; not yet appended.
        A part of desired `partition` records P = `partitions_total` and the function
        `partitioning` its rows were hashed with (`mvsink.core.partitioning`).

        Raises:
            InvalidUsage: empty bounds, an update outside them (`UpdateNotBeyondLower`,
                `UpdateBeyondUpper`), or columns that do not fit the shard's row schema.
        """
        if (partition is None) != (partitions_total is None):
            raise InvalidUsage("give both partition and partitions_total, or neither")
        if not writer_id or "/" in writer_id:
            raise InvalidUsage(f"writer id {writer_id!r} must be non-empty without '/'")
        table = normalize_updates(updates, self.schema)
        partio.check_bounds(table, lower, upper)
        data = partio.encode_part(
            table,
            {
                "mvsink.lower": str(lower.elements()),
                "mvsink.upper": str(upper.elements()),
                "mvsink.partition": str(partition),
                "mvsink.partitions_total": str(partitions_total),
                "mvsink.partitioning": str(partitioning),
                "mvsink.writer_id": writer_id,
            },
        )
        part = PartRef(
            self._part_key(writer_id),
            partition,
            partitions_total,
            table.num_rows,
            len(data),
            partitioning,
            lower=lower,
            upper=upper,
            writer_id=writer_id,
        )  # checked before anything is written
        self.blob.put(part.key, data, PARQUET)
        return part

    def restage(self, part: PartRef) -> PartRef:
        """`part` staged again under a fresh key (the same bytes, so its footer's bounds still
        hold), the old key deleted: for a writer whose part aged past `max_part_age` before it
        could add it, while staging the rest (a long merge's first outputs).

        Raises:
            PartGone: the part is gone already (the sweeper took it).
        """
        found = self.blob.get(part.key)
        if found is None:
            raise PartGone(f"part {part.key} of shard {self.shard_id} is gone")
        fresh = replace(part, key=self._part_key(part.writer_id))
        self.blob.put(fresh.key, found[0], PARQUET)
        self.blob.remove([part.key])
        return fresh

    def compare_and_append(
        self, parts: Iterable[PartRef], expected_upper: Frontier, new_upper: Frontier
    ) -> AppendResult:
        """Append `parts` as one batch `[expected_upper, new_upper)` iff the upper is
        `expected_upper`. The only path that moves the upper.

        Steps (`_compare_and_set`): 1. read the latest version `n`; 2. if its upper differs,
        return `UpperMismatch(current)`; 3. compute version `n+1` (pure); 4. create it with
        `If-None-Match: *`; 5. on a lost race (another `n+1`), go to 1. An indefinite create is
        settled by writing the *same bytes* again (idempotent, see `mvsink.io.s3`), never new ones.

        Raises:
            InvalidUsage: bounds the parts were not staged for, a part appended twice, a part
                older than `Timing.max_part_age` (`PartTooOld`).
            IndefiniteAppend: the outcome could not be settled in time; read `state()`.
        """
        parts = tuple(parts)
        self._check_part_ages(parts)

        def change(state: ShardState, nonce: str, now: float) -> ShardState | UpperMismatch:
            if state.upper != expected_upper:
                return UpperMismatch(state.upper, state.seqno)
            return apply_append(state, parts, expected_upper, new_upper, nonce, now)

        outcome = self._compare_and_set(change)
        if isinstance(outcome, ShardState):
            return Appended(new_upper, outcome.seqno)
        return outcome

    def compare_and_merge(self, request: MergeRequest, parts: Iterable[PartRef]) -> MergeResult:
        """Replace the live batches `request.inputs` by one batch of `parts` iff every input is
        still live (compare-and-merge); otherwise delete `parts` and return `MergeRefused`.
        Races safely with appends (they only add batches after the inputs), other merges and
        leases: each is one compare-and-set on the latest version.

        Raises:
            InvalidUsage: outputs staged for other bounds or too long ago (`PartTooOld`).
            IndefiniteAppend: the outcome could not be settled in time.
        """
        parts = tuple(parts)
        self._check_part_ages(parts)

        def change(state: ShardState, nonce: str, now: float) -> ShardState | MergeRefused:
            merged = apply_merge(state, request, parts, nonce, now)
            return MergeRefused(state.seqno) if merged is None else merged

        outcome = self._compare_and_set(change)
        if isinstance(outcome, ShardState):
            batch = next((b for b in outcome.batches if b.seqno == outcome.seqno), None)
            return Merged(
                batch or BatchRecord(request.lower, request.upper, outcome.seqno, ()), outcome.seqno
            )
        self.delete_staged(parts)
        return outcome

    def lease(
        self,
        reader_id: str,
        hold: Frontier | None = None,
        duration: float | None = None,
        holds: Mapping[str, Frontier] | None = None,
        pin: bool = False,
    ) -> ReaderLease:
        """Take or renew a reader lease: `since` will not pass `hold` (the current `since` if
        `None`; never moved backwards) for `duration` seconds (`Timing.reader_lease`). Renew
        before it expires; `release` when done. `holds` moves critical holds forward in the
        same version (`mvsink.shard.state.apply_lease`): they never expire. With `pin`, the
        lease also keeps the parts of version `lease.seqno` (read it with `version`) while it
        lives; a renewal keeps that seqno.

        Raises:
            AsOfBeforeSince: `since` is already past `hold` (or past an expired lease's hold).
        """
        expiry = duration if duration is not None else self.timing.reader_lease

        def change(state: ShardState, nonce: str, now: float) -> ShardState:
            return apply_lease(state, reader_id, hold, now + expiry, nonce, now, holds, pin)

        outcome = self._compare_and_set(change)
        assert isinstance(outcome, ShardState)
        lease = outcome.lease(reader_id)
        assert lease is not None
        return lease

    def release(self, reader_id: str) -> None:
        """Drop `reader_id`'s lease (`since` may then pass its hold)."""
        self._compare_and_set(lambda state, nonce, now: apply_release(state, reader_id, nonce, now))

    def set_holds(self, holds: Mapping[str, Frontier]) -> ShardState:
        """Set critical holds to exactly `holds` (`apply_set_holds`: backwards too, never
        before `since`).

        Raises:
            AsOfBeforeSince: a hold before `since`.
        """
        wanted = dict(holds)
        outcome = self._compare_and_set(
            lambda state, nonce, now: apply_set_holds(state, wanted, nonce, now)
        )
        assert isinstance(outcome, ShardState)
        return outcome

    def release_holds(self, holder_ids: Iterable[str]) -> ShardState:
        """Drop the critical holds of `holder_ids` (`since` may then pass where they held)."""
        holders = tuple(holder_ids)
        outcome = self._compare_and_set(
            lambda state, nonce, now: apply_release_holds(state, holders, nonce, now)
        )
        assert isinstance(outcome, ShardState)
        return outcome

    def set_sweep_horizon(self, horizon: float) -> ShardState:
        """Refuse, from the new version on, every part staged before `horizon` (unix seconds;
        `apply_sweep_horizon`, the sweeper's fence)."""
        outcome = self._compare_and_set(
            lambda state, nonce, now: apply_sweep_horizon(state, horizon, nonce, now)
        )
        assert isinstance(outcome, ShardState)
        return outcome

    def set_retain_history(self, retain_history: int | None) -> ShardState:
        """Make `since` trail the upper by `retain_history` times (`None`: keep everything)."""
        outcome = self._compare_and_set(
            lambda state, nonce, now: apply_retain_history(state, retain_history, nonce, now)
        )
        assert isinstance(outcome, ShardState)
        return outcome

    def _compare_and_set(
        self, change: Callable[[ShardState, str, float], ShardState | _Outcome]
    ) -> ShardState | _Outcome:
        """The one write path: read the latest version, compute its successor (pure; an
        expected outcome such as a mismatch is returned as it is), create it conditionally,
        start over on a lost race or an unproven create (`_create_version`). The successor's
        bytes carry a fresh nonce per attempt."""
        while True:
            read_at = self.clock.monotonic()
            state = self.state()
            successor = change(state, uuid.uuid4().hex, self.clock.time())
            if not isinstance(successor, ShardState):
                return successor
            if self._create_version(successor, read_at):
                return successor

    def _etag(self, seqno: int) -> str | None:
        cached = self._states.get(seqno)
        return None if cached is None else cached[1]

    def advance_upper(self, to: Frontier) -> Frontier:
        """Make the upper at least `to` with empty appends (persist's `append` of nothing):
        a no-op when it already is. Returns the upper after the call."""
        while True:
            current = self.upper()
            if to.less_equal(current):
                return current
            result = self.compare_and_append((), current, to)
            if isinstance(result, Appended):
                return result.new_upper

    def _check_part_ages(self, parts: tuple[PartRef, ...]) -> None:
        """The writer's early refusal of parts the sweeper may soon delete (the fence itself is
        the state's `sweep_horizon`, checked in every pass: `apply_append`, `apply_merge`)."""
        now = self.clock.time()
        for part in parts:
            if not part.key.startswith(f"{self.prefix}/parts/"):
                raise InvalidUsage(f"part {part.key} is not a part of shard {self.shard_id}")
            age = now - staged_at(part.key)
            if age > self.timing.max_part_age:
                raise PartTooOld(
                    f"part {part.key} was staged {age:.0f}s ago (> {self.timing.max_part_age}s)"
                )

    def _create_version(self, state: ShardState, read_at: float) -> bool:
        """Create `state` as the next version; whether it is now there *and* provably the
        successor of the version it was computed from (`_proven`). `False` (start over):
        another writer created that seqno first, our read is too old to act on, or the create
        cannot be proven.

        Raises:
            IndefiniteAppend: the create stayed indefinite, or landed and could not be proven
                for an S3 error: read the state to settle it.
        """
        data, key = state.to_bytes(), self.state_key(state.seqno)
        for _ in range(_INDEFINITE_RETRIES):
            if self.clock.monotonic() - read_at > self.timing.max_attempt_age:
                return False
            try:
                outcome = self.blob.create(key, data, timeout=self.timing.request_timeout)
            except IndefiniteWrite:
                self.clock.sleep(self.timing.poll_interval)
                continue
            if isinstance(outcome, PreconditionFailed):
                return False
            assert isinstance(outcome, Written)
            try:
                etag = self._proven(state, unquoted(outcome.etag), data)
                if etag is None:
                    return False
            except Exception as error:
                raise IndefiniteAppend(
                    f"created {key} but could not check it: {error!r}; read the state to settle it"
                ) from error
            self._remember(state, etag)
            self._latest, self._latest_etag = state.seqno, etag
            return True
        raise IndefiniteAppend(f"creating {key} stayed indefinite; read the state to settle it")

    def _proven(self, state: ShardState, etag: str, data: bytes | None = None) -> str | None:
        """The etag the LIST shows for the object `state` (etag `etag`; one we created, with
        our `data`, or one `listen` read) if it is the successor of the version it was
        computed from, else None: one LIST of the state keys after that version.

        The object listed at our key is ours when its etag is the create reply's, or, on a
        store whose create replies carry other etags than its LISTs, when its bytes are our
        `data` (one GET; unique to our attempt by its nonce, and a retry of it writes the same
        bytes with the same meaning).

        A create can succeed at a seqno the collector pruned (the key is absent: S3 cannot
        refuse it), if we paused between reading `n` and creating `n+1` while `n+1` and more
        were created and pruned. Then a newer version existed before our create and, the
        latest version never being pruned, one is listed now. So: ours listed alone proves it;
        ours followed by `n+2` computed from ours (its `prev` is our nonce) proves it too (only
        a latest version is built on); anything else (ours gone or replaced, a successor not
        built on ours, a gap) does not. An unproven object is never read as a version (`state`
        reads only the newest key) and the collector deletes it (`gc`); the caller starts
        over from the latest version, where a change that did land shows.
        """
        listed = self.blob.list(
            f"{self.prefix}/state/", start_after=self.state_key(state.seqno - 1)
        )
        if not listed or listed[0].key != self.state_key(state.seqno):
            return None
        if listed[0].etag != etag and not self._holds(listed[0], data):
            return None
        if len(listed) > 1:
            if listed[1].key != self.state_key(state.seqno + 1):
                return None
            following = self.version(state.seqno + 1, listed[1].etag)
            if following is None or following.prev != state.nonce:
                return None
        return listed[0].etag

    def _holds(self, listed: Listed, data: bytes | None) -> bool:
        """Whether the object `listed` (as the LIST showed it) holds exactly `data`."""
        found = None if data is None else self.blob.get(listed.key)
        return found is not None and found[1] == listed.etag and found[0] == data

    @classmethod
    def create_or_open(
        cls,
        client: Minio,
        bucket: str,
        shard_id: str,
        schema: pa.Schema | None,
        timing: Timing,
        retain_history: int | None = None,
        *,
        blob: Blob | None = None,
        clock: Clock = SYSTEM,
    ) -> Shard:
        """See `open_shard` (`blob` and `clock`: the simulation's, `mvsink.shard.blob`)."""
        probe = cls(
            client, bucket, shard_id, schema or pa.schema([]), timing, blob=blob, clock=clock
        )
        existing = probe.retained_seqnos()
        if not existing:
            if schema is None:
                raise ShardNotFound(f"shard {shard_id} does not exist in bucket {bucket}")
            zero = initial_state(shard_id, schema, uuid.uuid4().hex, retain_history)
            probe.blob.create(probe.state_key(0), zero.to_bytes())
        stored = probe.state().schema
        if schema is not None and not same_schema(stored, schema):
            raise SchemaMismatch(
                f"shard {shard_id} has row schema {_fields(stored)}, not {_fields(schema)}"
            )
        probe.schema = stored
        return probe

    # -- readers ----------------------------------------------------------------------------

    def wait_for_upper_past(self, frontier: Frontier, timeout: float) -> Frontier:
        """Block until the upper is strictly past `frontier`; the upper then.

        Raises:
            TimeoutError: not within `timeout` seconds.
        """
        deadline = self.clock.monotonic() + timeout
        delay = self.timing.poll_interval
        while True:
            upper = self.upper()
            if frontier.less_than(upper):
                return upper
            if self.clock.monotonic() >= deadline:
                raise TimeoutError(f"shard {self.shard_id} upper {upper} not past {frontier}")
            self.clock.sleep(delay)
            delay = min(delay * 2, 1.0)

    def listen(self, after_seqno: int, idle_timeout: float | None = None) -> Iterator[ShardState]:
        """The state versions after `after_seqno`, in order, as they are created; each carries
        the batch it appended in `.appended`. Returns after `idle_timeout` seconds without a new
        version (never, if `None`).

        Raises:
            MvsinkError: the next version was pruned before it could be read.
        """
        seqno = after_seqno
        idle_since = self.clock.monotonic()
        while True:
            state = self.version(seqno + 1)
            if state is not None:
                # The object there is the version, not a pruned seqno a paused writer wrote
                # again, only if `_proven` says so (as for a writer's own create).
                if self._proven(state, self._etag(seqno + 1) or "") is None:
                    raise MvsinkError(f"shard {self.shard_id}: version {seqno + 1} was pruned")
                seqno, idle_since = seqno + 1, self.clock.monotonic()
                yield state
                continue
            if any(s > seqno + 1 for s in self.retained_seqnos()) and (
                self.version(seqno + 1) is None  # not created just after our read: pruned
            ):
                raise MvsinkError(f"shard {self.shard_id}: version {seqno + 1} was pruned")
            if idle_timeout is not None and self.clock.monotonic() - idle_since > idle_timeout:
                return
            self.clock.sleep(self.timing.poll_interval)

    def parts_for(
        self,
        partition: int | None,
        lower: Frontier,
        upper: Frontier,
        partitions_total: int | None = None,
        state: ShardState | None = None,
        partitioning: int = CURRENT,
    ) -> list[SelectedPart]:
        """Parts of batches overlapping `[lower, upper)` that hold updates of desired partition
        `partition` under P = `partitions_total` and function `partitioning` (every part if
        `partition` is None). A merged batch may also hold updates before `lower`: a reader of
        changes filters by time."""
        state = state or self.state()
        batches = overlapping(state.batches, lower, upper)
        return select_parts(batches, partition, partitions_total, partitioning)

    def read_part(self, part: PartRef) -> pa.Table:
        """The updates of one part.

        Raises:
            PartGone: a merge replaced it and it was deleted; read the latest version again.
        """
        found = self.blob.get(part.key)
        if found is None:
            raise PartGone(f"part {part.key} of shard {self.shard_id} is gone")
        return partio.decode_part(found[0], self.schema)

    def read_parts(
        self,
        selected: list[SelectedPart],
        partitions: Collection[int] | None = None,
        partitions_total: int | None = None,
        partitioning: int = CURRENT,
    ) -> pa.Table:
        """The updates of the `selected` parts (read in parallel), rows of parts that need it
        filtered to `partitions` under `partitions_total` and function `partitioning`."""
        wanted = None if partitions is None else pa.array(sorted(partitions), pa.int32())

        def load(choice: SelectedPart) -> pa.Table:
            table = self.read_part(choice.part)
            if choice.needs_filter and wanted is not None and partitions_total is not None:
                hashes = partitions_of(table, self.schema, partitions_total, partitioning)
                table = table.filter(pc.is_in(hashes, value_set=wanted))
            return table

        if not selected:
            return part_schema(self.schema).empty_table()
        if self.read_threads <= 1 or len(selected) == 1:
            tables = [load(choice) for choice in selected]
        else:
            with ThreadPoolExecutor(max_workers=min(self.read_threads, len(selected))) as pool:
                tables = list(pool.map(load, selected))
        return pa.concat_tables(tables)

    def snapshot(
        self,
        as_of: Frontier | int,
        partitions: Collection[int] | None = None,
        partitions_total: int | None = None,
        partitioning: int = CURRENT,
    ) -> pa.Table:
        """The shard's contents at frontier `as_of` (updates with time `< as_of`), consolidated,
        times advanced to `as_of - 1`; optionally only desired `partitions` under P (and
        function `partitioning`). A read whose
        parts a merge replaced meanwhile starts over from the latest version (same contents).

        Raises:
            InvalidUsage: `as_of` is beyond the upper (those times are not final: wait with
                `wait_for_upper_past` first).
            AsOfBeforeSince: `as_of` is before `since` (hold a `lease` to keep history).
        """
        frontier = Frontier.at(as_of) if isinstance(as_of, int) else as_of
        if (partitions is None) != (partitions_total is None):
            raise InvalidUsage("give both partitions and partitions_total, or neither")
        for _ in range(_READ_ATTEMPTS):
            state = self.state()
            self.check_readable(state, frontier)
            selected: list[SelectedPart] = []
            for partition in sorted(partitions) if partitions is not None else [None]:
                found = self.parts_for(
                    partition, Frontier.minimum(), frontier, partitions_total, state, partitioning
                )
                selected.extend(
                    s for s in found if s.part.key not in {c.part.key for c in selected}
                )
            try:
                table = self.read_parts(selected, partitions, partitions_total, partitioning)
            except PartGone:
                continue
            return partio.consolidate_at(table, self.schema, frontier)
        raise PartGone(f"shard {self.shard_id}: parts kept vanishing under {_READ_ATTEMPTS} reads")

    def check_readable(self, state: ShardState, as_of: Frontier) -> None:
        """`since <= as_of <= upper`, or the error that says which bound is violated."""
        if not as_of.less_equal(state.upper):
            raise InvalidUsage(
                f"as_of {as_of} is beyond the upper {state.upper} of {self.shard_id}"
            )
        if not state.since.less_equal(as_of):
            raise AsOfBeforeSince(
                f"as_of {as_of} is before the since {state.since} of {self.shard_id}: that "
                "history was compacted away (hold a reader lease to keep it)"
            )

    # -- deleting (mvsink.shard.gc) -----------------------------------------------------------

    def referenced_keys(self) -> frozenset[str]:
        """Keys of every part referenced by any retained state version."""
        return gc.referenced_keys(self)

    def delete_staged(self, parts: Iterable[PartRef]) -> DeleteResult:
        """See `mvsink.shard.gc.delete_staged`."""
        return gc.delete_staged(self, parts)

    def claim_refusal(self, parts: Iterable[PartRef]) -> str | None:
        """See `mvsink.shard.gc.claim_refusal`."""
        return gc.claim_refusal(self, parts)

    def collect_garbage(self) -> GcResult:
        """See `mvsink.shard.gc.collect_garbage`."""
        return gc.collect_garbage(self)

    def sweep(self, grace: float) -> SweepResult:
        """See `mvsink.shard.gc.sweep`."""
        return gc.sweep(self, grace)


def _seqno(key: str) -> int:
    return int(key.rsplit("/", 1)[-1])


def _fields(schema: pa.Schema) -> str:
    return "(" + ", ".join(f"{f.name} {f.type}" for f in schema) + ")"
