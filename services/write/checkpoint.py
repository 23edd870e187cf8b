"""A write task's correction state per desired partition, and its checkpoints in object storage
(`sinks/<sink>/write/p<N>/<version:020d>.arrow`).

A task continues from the version the driver expects, found in the first of (the first two may
have folded past that version's checkpoint: a gained partition's first fold and first staging
step keep their state without one, `keep`):
1. this Python worker's memory (its `StateCache`, part of the task's
   `services.write.task.WriteWorker`);
2. the executor's warm copy (`executor_dir()/warm/<sink>/p<N>.pickle`): an executor runs
   several Python workers and Spark picks any for a task, so each saved state is also written
   where every Python worker of the executor finds it (the executor's local directory, removed
   with it). It includes the parts the state staged, so their read-back stays free. A
   resident task writes the warm copies of the states it saved when it leaves
   (`StateCache.warm_copies` off): meanwhile its own memory serves them, and a partition moved
   to a sibling resident reads the checkpoint;
3. the checkpoint in object storage (a restart, or a partition moved to another executor);
4. empty (version -1: nothing checkpointed yet).

A checkpoint is an Arrow IPC stream (LZ4, `updates_to_ipc`) of the corrections
(`consolidate()`) with the state's metadata (`since`, `folded_offset`, `desired_frontier`,
`persist_folded`, writer) in its schema metadata; checkpoints written before were Parquet and
are still read. Versions are created conditionally, so two owners of one partition cannot both
continue from the same one (invariant 4 of `services.write`); the previous version is kept for
a driver that has not seen the newest. Older ones are garbage: deleted off the step's path
(`Collector`), and by a driver gaining the partition (`Checkpoints.collect_superseded`).

Every call to object storage goes through a `Checkpoints` handle: a `mvsink.shard.blob.Blob` on
the bucket, the `Clock`, and the handle's own collector; a worker and a driver each keep one
(`services.write.task.WriteWorker.checkpoints`). So the same code runs against MinIO/S3 and in
the deterministic simulation (`tests/sim/simchain.py`), which freezes calls, loses replies and
lands creates late. What stays in the executor (the states in memory, their warm copies) is the
`StateCache`'s.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq
from minio.error import S3Error

from mvsink.core.errors import InvalidUsage, MvsinkError
from mvsink.core.frontier import Frontier
from mvsink.core.settings import S3Settings
from mvsink.core.updates import part_schema, updates_to_ipc
from mvsink.io.s3 import PreconditionFailed, get_bytes, s3_client
from mvsink.io.spark import executor_dir
from mvsink.shard.blob import SYSTEM, Blob, Clock, MinioBlob
from services.write.correction import Correction
from services.write.state import since_passed as since_passed

log = logging.getLogger("mvsink.write.task")


@dataclass
class PartitionState:
    """The correction state of one partition and how far it has folded its inputs."""

    version: int
    correction: Correction
    folded_offset: int
    desired_frontier: Frontier
    persist_folded: Frontier
    #: Parts this executor staged, by key: (the batch's upper, the contents), kept until the
    #: read-back passes that upper.
    staged: dict[str, tuple[Frontier, pa.Table]] = field(default_factory=dict)
    #: Loaded from a Parquet checkpoint (written before checkpoints were Arrow IPC).
    legacy: bool = False
    #: Offsets of the desired records this state's folds quarantined and no replay has brought
    #: back yet (`services.write.fold`: a replayed copy is folded only if its original's offset
    #: is here, then removed, so it is folded once, and never beside its original).
    quarantined: set[int] = field(default_factory=set)


def executor_warm_dir() -> Path:
    """Where the executor's Python workers keep their warm copies (read at each use: the
    executor's local directory, `mvsink.io.spark.executor_dir`)."""
    return executor_dir() / "warm"


@dataclass
class StateCache:
    """The correction states a Python worker holds in memory, and when it writes their warm
    copies. Steps of different partitions may use one cache from several threads at once; a
    partition's state is used by one step at a time."""

    #: The states, by (sink, partition). Two caches may share this dict (a resident's and the
    #: one-shot tasks' of one Python worker: `services.write.task.WriteWorker.resident`).
    states: dict[tuple[str, int], PartitionState] = field(default_factory=dict)
    #: Whether `save` also writes the executor's warm copy. Off in a resident task
    #: (`services.write.resident`): it keeps its partitions in memory from step to step and
    #: writes their warm copies once, when it leaves (`save_warm_copies`). A worker killed
    #: meanwhile leaves older warm copies, which are not loaded (wrong version).
    warm_copies: bool = True
    #: The states saved while `warm_copies` was off, whose warm copies are due.
    deferred: set[tuple[str, int]] = field(default_factory=set)
    #: Creates under way (`save_later`), and the versions they created, not yet reported
    #: (`resolve`), by (sink, partition); shared like `states`.
    pending: dict[tuple[str, int], Pending] = field(default_factory=dict)
    confirmed: dict[tuple[str, int], Confirmed] = field(default_factory=dict)
    #: The directory of the executor's warm copies, asked at each use; None keeps none (a
    #: process that is no executor: a repair, the simulation).
    warm_dir: Callable[[], Path] | None = executor_warm_dir

    def drop(self, sink_id: str, partition: int) -> None:
        """Forget the partition's state (a failed step may have left it half changed)."""
        self.states.pop((sink_id, partition), None)

    def save_warm_copies(self) -> int:
        """Write the warm copies `save` deferred (a resident leaving: only the states it saved
        itself, not older ones this worker still holds); how many. Best effort: a copy that
        cannot be written only costs its next loader a read of the checkpoint."""
        written = 0
        for key in sorted(self.deferred):
            state = self.states.get(key)
            try:
                if state is not None and key not in self.pending:  # resolved states only
                    self.save_warm(*key, state)
                    written += 1
            except OSError as error:
                log.warning("writing the warm copy of %s failed: %r", key, error)
        self.deferred.clear()
        return written

    def _warm_path(self, sink_id: str, partition: int) -> Path | None:
        if self.warm_dir is None:
            return None
        return self.warm_dir() / sink_id / f"p{partition}.pickle"

    def load_warm(self, sink_id: str, partition: int, version: int) -> PartitionState | None:
        """The executor's warm copy of the partition if it is at `version`."""
        path = self._warm_path(sink_id, partition)
        if path is None:
            return None
        try:
            with path.open("rb") as source:
                state = pickle.load(source)  # written by this executor's own Python workers
        except (OSError, EOFError, pickle.UnpicklingError):
            return None
        return state if isinstance(state, PartitionState) and state.version == version else None

    def save_warm(self, sink_id: str, partition: int, state: PartitionState | None) -> None:
        """Write (or, for None, drop) the executor's warm copy; atomic (write, then rename)."""
        path = self._warm_path(sink_id, partition)
        if path is None:
            return
        if state is None:
            with suppress(OSError):
                path.unlink()
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        with partial.open("wb") as out:
            pickle.dump(state, out, protocol=pickle.HIGHEST_PROTOCOL)
        partial.replace(path)


def checkpoint_key(sink_id: str, partition: int, version: int, suffix: str = "arrow") -> str:
    """Object key of a correction checkpoint: an Arrow IPC stream (LZ4, `updates_to_ipc`), the
    state's metadata in its schema metadata. Legacy Parquet checkpoints (`suffix="parquet"`)
    are still read."""
    return f"sinks/{sink_id}/write/p{partition}/{version:020d}.{suffix}"


def holder_id(sink_id: str, partition: int) -> str:
    """The shard's critical hold that keeps the partition's latest checkpoint valid: `since`
    never passes its `persist_folded` (`services.write.shell.WriteShell._hold`)."""
    return f"checkpoint:{sink_id}:p{partition}"


#: How much of a checkpoint `Checkpoints.read_meta` fetches: its Arrow schema message, metadata
#: included.
META_PREFIX = 1 << 16


class CheckpointBlob(Blob, Protocol):
    """A `Blob` that also reads the first bytes of an object (an Arrow stream's schema)."""

    def head(self, key: str, length: int) -> bytes | None: ...


class MinioCheckpointBlob(MinioBlob):
    """`CheckpointBlob` on a MinIO-SDK client and bucket."""

    def head(self, key: str, length: int) -> bytes | None:
        try:
            return get_bytes(self.client, self.bucket, key, length=length)
        except S3Error as error:
            if error.code in ("NoSuchKey", "NoSuchObject"):
                return None
            raise


class NoCheckpoint(MvsinkError):
    """A checkpoint version that is not in object storage (neither Arrow nor legacy Parquet)."""


class Collector(Protocol):
    """Where a `Checkpoints` handle sends the keys a create supersedes (`GatheringCollector`;
    the simulation's deletes them as an actor of its own)."""

    def collect(self, keys: list[str]) -> None: ...

    def settle(self) -> None: ...


class Checkpoints:
    """The checkpoints of a bucket's sinks: every call the write service makes to object
    storage for them (module docs), and the deletion of superseded versions (`collector`)."""

    def __init__(
        self, blob: CheckpointBlob, clock: Clock = SYSTEM, collector: Collector | None = None
    ):
        self.blob = blob
        self.clock = clock
        self.collector: Collector = (
            GatheringCollector(blob, clock) if collector is None else collector
        )

    @classmethod
    def of(cls, s3: S3Settings, clock: Clock = SYSTEM) -> Checkpoints:
        """A handle on `s3`'s bucket, with a client (its connection pool) of its own."""
        return cls(MinioCheckpointBlob(s3_client(s3), s3.bucket), clock)

    def latest(self, sink_id: str, partition: int) -> int:
        """The partition's newest checkpoint version in object storage (-1: none)."""
        return max((version for version, _ in self._versions(sink_id, partition)), default=-1)

    def _versions(self, sink_id: str, partition: int) -> list[tuple[int, str]]:
        """The partition's checkpoints in object storage: (version, key) each."""
        listed = self.blob.list(f"sinks/{sink_id}/write/p{partition}/")
        return [(_version(o.key), o.key) for o in listed]

    def exists(self, sink_id: str, partition: int, version: int) -> bool:
        """Whether checkpoint `version` exists (Arrow or legacy Parquet)."""
        return any(
            self.blob.stat(checkpoint_key(sink_id, partition, version, suffix)) is not None
            for suffix in ("arrow", "parquet")
        )

    def read_meta(self, sink_id: str, partition: int, version: int) -> dict[str, Any] | None:
        """Checkpoint `version`'s metadata (`since`, `folded_offset`, `desired_frontier`,
        `persist_folded`, `writer_id`) from the first bytes of its stream, without the data;
        None for no checkpoint (-1), a gone one, or a legacy Parquet one."""
        if version < 0:
            return None
        key = checkpoint_key(sink_id, partition, version)
        head = self.blob.head(key, META_PREFIX)
        if head is None:
            return None
        try:
            schema = pa.ipc.open_stream(head).schema
        except pa.ArrowInvalid:  # a schema larger than the prefix: read it all
            found = self.blob.get(key)
            if found is None:
                return None
            schema = pa.ipc.open_stream(found[0]).schema
        meta: dict[str, Any] = json.loads(schema.metadata[b"mvsink.write"])
        return meta

    def seed(
        self,
        sink_id: str,
        partition: int,
        writer_id: str,
        row_schema: pa.Schema,
        frontier: Frontier,
        folded_offset: int,
        corrections: pa.Table | None = None,
        replaces: int | None = None,
    ) -> int | None:
        """Write the next checkpoint version of a partition whose desired records before
        `folded_offset` at times before `frontier` equal the shard's contents before `frontier`
        (`services.write.repair`): both inputs folded to `frontier`, `corrections` (desired
        updates at `frontier` or later that come before `folded_offset`) still to be written.
        Its version (the one after `replaces`, default the newest), or None if another writer
        created that version first."""
        correction = Correction(row_schema, frontier)
        if corrections is not None and corrections.num_rows:
            correction.insert(corrections)
        before = self.latest(sink_id, partition) if replaces is None else replaces
        state = PartitionState(before, correction, folded_offset, frontier, frontier)
        saved = self.save(sink_id, partition, writer_id, state, StateCache(warm_dir=None))
        return state.version if saved is not None else None

    def load(
        self,
        sink_id: str,
        partition: int,
        version: int,
        row_schema: pa.Schema,
        as_of: int,
        cache: StateCache,
        durable: int | None = None,
    ) -> tuple[PartitionState, int]:
        """The state at checkpoint `version` (-1: none yet), and the bytes read from object
        storage to get it (0 when this executor holds it: in `cache`, or its warm copy, then
        kept in `cache`).

        `durable` (default `version`) is the newest version the driver knows was created. A
        pipelined create (`save_later`) of `version` may have died with its Python worker: when
        `version` is absent, the state is `durable`'s, and the step's own create of `version`
        then races any straggler's, conditionally. If a version at or past `version` exists by
        then, the caller lost the chain (`Superseded`); so did one expecting a version that
        was created and then collected: another owner's chain went on two versions past it.

        Raises:
            NoCheckpoint: `version` (or, absent, `durable`) is not in object storage, and no
                newer version is.
        """
        try:
            return self._load(sink_id, partition, version, row_schema, as_of, cache)
        except NoCheckpoint:
            if durable is None or durable >= version:  # created, so collected if newer exist
                if self.latest(sink_id, partition) > version:
                    raise Superseded(
                        f"partition {partition}: version {version} was collected after newer ones"
                    ) from None
                raise
        if self.latest(sink_id, partition) >= version:
            raise Superseded(
                f"partition {partition}: version {version} was created by another owner"
            )
        log.warning(
            "partition %d: checkpoint %d was never created: continuing from %d",
            partition,
            version,
            durable,
        )
        return self._load(sink_id, partition, durable, row_schema, as_of, cache)

    def _load(
        self,
        sink_id: str,
        partition: int,
        version: int,
        row_schema: pa.Schema,
        as_of: int,
        cache: StateCache,
    ) -> tuple[PartitionState, int]:
        cached = cache.states.get((sink_id, partition))
        if cached is not None and cached.version == version:
            return cached, 0
        warm = cache.load_warm(sink_id, partition, version)
        if warm is not None:
            cache.states[(sink_id, partition)] = warm
            return warm, 0
        if version < 0:
            return empty(row_schema, as_of, -1), 0
        table, legacy, size = self._read(sink_id, partition, version)
        meta = json.loads(table.schema.metadata[b"mvsink.write"])
        table = table.replace_schema_metadata(None).cast(part_schema(row_schema))
        since = Frontier.from_elements(meta["since"])
        state = PartitionState(
            version,
            Correction(row_schema, since, table),
            meta["folded_offset"],
            Frontier.from_elements(meta["desired_frontier"]),
            Frontier.from_elements(meta["persist_folded"]),
            legacy=legacy,
            quarantined=set(meta.get("quarantined", ())),
        )
        return state, size

    def _read(self, sink_id: str, partition: int, version: int) -> tuple[pa.Table, bool, int]:
        """Checkpoint `version`, whether it was a (legacy) Parquet one, and its size.

        Raises:
            NoCheckpoint: neither is there.
        """
        key = checkpoint_key(sink_id, partition, version)
        found = self.blob.get(key)
        if found is not None:
            return pa.ipc.open_stream(found[0]).read_all(), False, len(found[0])
        legacy = self.blob.get(checkpoint_key(sink_id, partition, version, "parquet"))
        if legacy is None:
            raise NoCheckpoint(
                f"partition {partition}: checkpoint {version} is gone (NoSuchKey: {key})"
            )
        return pq.read_table(io.BytesIO(legacy[0])), True, len(legacy[0])

    def create(self, sink_id: str, partition: int, snap: Snapshot) -> int | None:
        """Create `snap`'s version, conditionally; its size, or None if another owner created
        it first. The garbage it supersedes is then deleted off the caller's path.

        A create that succeeds is the chain's only if no newer version exists (one LIST, as
        the shard proves its versions): a version is collected once two newer ones exist
        (`snapshot`), and a create that paused past that finds the key free and writes it
        again. Such an object is no version of the chain (nothing continues from it, the next
        owner to gain the partition deletes it), so that create lost too: what lets go of
        history (the holds, the kept desired offsets) must never follow it past the chain's
        newest version (invariants 0 and 4 of `services.write`).

        Raises:
            IndefiniteWrite: the create may land later, or not at all (the step fails; its
                version is raced conditionally by the next step that expects it, `load`).
        """
        table = snap.table.replace_schema_metadata({"mvsink.write": json.dumps(snap.meta)})
        data = updates_to_ipc(table)
        key = checkpoint_key(sink_id, partition, snap.version)
        if isinstance(self.blob.create(key, data), PreconditionFailed):
            return None
        newer = self.blob.list(f"sinks/{sink_id}/write/p{partition}/", start_after=key)
        if any(_version(listed.key) > snap.version for listed in newer):
            log.warning(
                "partition %d: checkpoint %d was created after newer versions: lost",
                partition,
                snap.version,
            )
            return None
        self.collector.collect(list(snap.garbage))
        return len(data)

    def save(
        self,
        sink_id: str,
        partition: int,
        writer_id: str,
        state: PartitionState,
        cache: StateCache,
    ) -> int | None:
        """Write `state` as the next version, kept in `cache` (and its warm copy written, or
        due, as `cache.warm_copies` says); its size, or None if another owner wrote it first
        (then the partition is dropped from `cache` and its warm copy deleted)."""
        snap = snapshot(sink_id, partition, writer_id, state)
        size = self.create(sink_id, partition, snap)
        if size is None:
            _lost(sink_id, partition, cache)
            return None
        state.version, state.legacy = snap.version, False
        keep(sink_id, partition, state, cache)
        return size

    def save_later(
        self,
        sink_id: str,
        partition: int,
        writer_id: str,
        state: PartitionState,
        cache: StateCache,
        pool: Executor,
    ) -> None:
        """`save`, pipelined: `state` is kept at the next version at once and that version is
        created on `pool` while the step reports. Nothing continues from it before `resolve` has
        found it created (invariant 4 of `services.write`): the partition's next step in this
        Python worker, a resident leaving, or a failed step resolves it; its warm copy is due
        only then (`StateCache.save_warm_copies` writes copies of resolved states only)."""
        key = (sink_id, partition)
        if key in cache.pending:
            raise InvalidUsage(f"partition {partition}: a create is already under way")
        snap = snapshot(sink_id, partition, writer_id, state)
        future = pool.submit(self.create, sink_id, partition, snap)
        cache.pending[key] = Pending(
            snap.version, state.folded_offset, state.persist_folded, future
        )
        state.version, state.legacy = snap.version, False
        keep(sink_id, partition, state, cache)

    def collect_superseded(self, sink_id: str, partition: int) -> int:
        """The partition's newest checkpoint version (-1: none), after deleting every version
        older than the one before it: what a process that died or paused with its deletes
        queued (`Collector`) left behind, or a create that landed after its key was collected.
        For a driver gaining the partition; the two newest stay (`save`)."""
        found = self._versions(sink_id, partition)
        newest = max((version for version, _ in found), default=-1)
        old = [name for version, name in found if version < newest - 1]
        try:
            self.blob.remove(old)
        except Exception as error:  # garbage only: the next owner tries again
            log.warning(
                "partition %d: deleting superseded checkpoints failed: %r", partition, error
            )
        else:
            if old:
                log.info("partition %d: deleted %d superseded checkpoints", partition, len(old))
        return newest

    def settle(self) -> None:
        """Wait until every superseded version queued for deletion has been tried."""
        self.collector.settle()


def _version(key: str) -> int:
    """The version of a checkpoint's key (`checkpoint_key`)."""
    return int(key.rsplit("/", 1)[-1].split(".")[0])


def empty(row_schema: pa.Schema, as_of: int, version: int) -> PartitionState:
    """Nothing folded yet: desired from offset 0, the shard from the start."""
    correction = Correction(row_schema, Frontier.at(as_of))
    return PartitionState(version, correction, 0, Frontier.minimum(), Frontier.minimum())


def keep(sink_id: str, partition: int, state: PartitionState, cache: StateCache) -> None:
    """Keep `state` in `cache` at its version, its warm copy written or due as
    `cache.warm_copies` says: after `save`, or for a step that checkpoints nothing (a gained
    partition's first fold or first staging step, `services.write.state.Keep`; the parts that
    one staged stay in `state.staged`). A state kept without a checkpoint has folded past the
    version it carries; a step that continues from that version folds on from where it is, and
    one that loads the checkpoint (or, at version -1, nothing) folds the difference again."""
    cache.states[(sink_id, partition)] = state
    if cache.warm_copies:
        cache.save_warm(sink_id, partition, state)
    else:
        cache.deferred.add((sink_id, partition))


@dataclass(frozen=True)
class Snapshot:
    """A state as it is at the end of a step, to write as version `version`: immutable (the
    consolidated table and the metadata), so the next step may change the live state in place
    while its checkpoint is written (`Checkpoints.save_later`)."""

    version: int
    table: pa.Table
    meta: dict[str, Any]
    #: Keys that are garbage once `version` exists (`Collector`).
    garbage: tuple[str, ...]


@dataclass(frozen=True)
class Confirmed:
    """A checkpoint version this Python worker created after its step had reported (a
    pipelined create, `Checkpoints.save_later`), and what the state it holds had folded."""

    version: int
    folded_offset: int
    persist_folded: Frontier
    size: int


@dataclass(frozen=True)
class Pending:
    """A create under way (`Checkpoints.save_later`)."""

    version: int
    folded_offset: int
    persist_folded: Frontier
    future: Future[int | None]


class Superseded(Exception):
    """The version a step expected is absent and a newer one exists: its owner lost the chain."""


def snapshot(sink_id: str, partition: int, writer_id: str, state: PartitionState) -> Snapshot:
    """`state` as the next version's checkpoint."""
    version = state.version + 1
    meta = {
        "since": state.correction.since.elements(),
        "folded_offset": state.folded_offset,
        "desired_frontier": state.desired_frontier.elements(),
        "persist_folded": state.persist_folded.elements(),
        "writer_id": writer_id,
    }
    if state.quarantined:  # absent when empty, as in checkpoints written before it existed
        meta["quarantined"] = sorted(state.quarantined)
    garbage = []
    if version >= 2:  # keep the previous version for a driver that has not seen this one
        garbage.append(checkpoint_key(sink_id, partition, version - 2))
    if state.legacy:  # the first Arrow checkpoint after Parquet ones: those are garbage now
        garbage += [
            checkpoint_key(sink_id, partition, v, "parquet") for v in (version - 1, version - 2)
        ]
    return Snapshot(version, state.correction.consolidate(), meta, tuple(garbage))


def resolve(sink_id: str, partition: int, cache: StateCache) -> int | None:
    """Wait for the partition's create under way (`Checkpoints.save_later`), if any: the version
    it lost to another owner (the state it was of is dropped, as `save` drops it), or None (none
    was under way, or it was created: `cache.confirmed` records it for the partition's next
    result). A create that failed drops the state and raises its error."""
    key = (sink_id, partition)
    pending = cache.pending.pop(key, None)
    if pending is None:
        return None
    try:
        size = pending.future.result()
    except BaseException:
        _lost(sink_id, partition, cache)
        raise
    if size is None:
        _lost(sink_id, partition, cache)
        return pending.version
    cache.confirmed[key] = Confirmed(
        pending.version, pending.folded_offset, pending.persist_folded, size
    )
    return None


def _lost(sink_id: str, partition: int, cache: StateCache) -> None:
    """Forget a state whose version another owner created (or whose create failed)."""
    cache.drop(sink_id, partition)
    cache.save_warm(sink_id, partition, None)


class GatheringCollector:
    """Deletes superseded checkpoints off the step's path, on one thread of the handle's.

    Pure garbage collection: loads name an exact version, and the versions deleted are two
    behind one this owner created (or older, `Checkpoints.collect_superseded`), which no step
    continues from: a driver that has not seen the newest expects the one before it. So nothing
    rests on when a delete runs. A process that pauses, or dies, with deletes queued leaves
    those objects behind until the partition's next owner starts (`collect_superseded`); a
    failed delete is logged and left to that too.

    Keys queued within `GATHER` seconds of each other go in one multi-object delete: every save
    supersedes one version, and object storage spends about as much on a request as on its keys
    (one request a save was about one in seven of the sink's requests to MinIO). The window is
    timed on `clock` and waited for on the thread's queue (a real thread's wait: the simulation
    gives its handles a collector of its own)."""

    #: Seconds a delete waits for more keys to send with it.
    GATHER = 1.0

    def __init__(self, blob: Blob, clock: Clock = SYSTEM) -> None:
        self.blob = blob
        self.clock = clock
        self.queue: queue.Queue[list[str] | None] = queue.Queue()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def collect(self, keys: list[str]) -> None:
        """Queue `keys` for deletion."""
        if not keys:
            return
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="checkpoint-gc", daemon=True)
                self.thread.start()
        self.queue.put(keys)

    def settle(self) -> None:
        """Wait until every queued delete has been tried (sent at once, not gathered)."""
        with self.lock:
            if self.thread is not None and self.thread.is_alive():
                self.queue.put(None)  # ends the gathering
        self.queue.join()

    def _gather(self) -> list[list[str] | None]:
        """The next queued item and those queued within `GATHER` seconds of it, or until a
        `settle` asks for them."""
        items = [self.queue.get()]
        deadline = self.clock.monotonic() + self.GATHER
        while items[-1] is not None and (left := deadline - self.clock.monotonic()) > 0:
            try:
                items.append(self.queue.get(timeout=left))
            except queue.Empty:
                break
        return items

    def _run(self) -> None:
        while True:
            items = self._gather()
            keys = [key for item in items if item is not None for key in item]
            if keys:
                try:
                    self.blob.remove(keys)
                except Exception as error:  # best effort: the next owner's collect_superseded
                    log.warning("deleting superseded checkpoints %s failed: %r", keys, error)
            for _ in items:
                self.queue.task_done()
