"""A write task's correction state per desired partition, and its checkpoints in object storage
(`sinks/<sink>/write/p<N>/<version:020d>.arrow`).

A task continues from the version the driver expects, found in the first of (the first two may
have folded past that version's checkpoint: a first fold keeps its state without one, `keep`):
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
(`_Collector`), and by a driver gaining the partition (`collect_superseded`).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import os
import pickle
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from minio import Minio
from minio.error import S3Error

from mvsink.core.frontier import Frontier
from mvsink.core.settings import S3Settings
from mvsink.core.updates import part_schema, updates_to_ipc
from mvsink.io.s3 import PreconditionFailed, conditional_put, get_bytes, s3_client
from mvsink.io.spark import executor_dir
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
                if state is not None:
                    _save_warm(*key, state)
                    written += 1
            except OSError as error:
                log.warning("writing the warm copy of %s failed: %r", key, error)
        self.deferred.clear()
        return written


def checkpoint_key(sink_id: str, partition: int, version: int, suffix: str = "arrow") -> str:
    """Object key of a correction checkpoint: an Arrow IPC stream (LZ4, `updates_to_ipc`), the
    state's metadata in its schema metadata. Legacy Parquet checkpoints (`suffix="parquet"`)
    are still read."""
    return f"sinks/{sink_id}/write/p{partition}/{version:020d}.{suffix}"


def holder_id(sink_id: str, partition: int) -> str:
    """The shard's critical hold that keeps the partition's latest checkpoint valid: `since`
    never passes its `persist_folded` (`services.write.shell.WriteShell._hold`)."""
    return f"checkpoint:{sink_id}:p{partition}"


@functools.cache
def _client(s3: S3Settings) -> Minio:
    """One client (its connection pool) per object store for this process's checkpoints."""
    return s3_client(s3)


def latest(sink_id: str, partition: int, s3: S3Settings) -> int:
    """The partition's newest checkpoint version in object storage (-1: none)."""
    return max((version for version, _ in _versions(sink_id, partition, s3)), default=-1)


def _versions(sink_id: str, partition: int, s3: S3Settings) -> list[tuple[int, str]]:
    """The partition's checkpoints in object storage: (version, key) each."""
    objects = _client(s3).list_objects(s3.bucket, prefix=f"sinks/{sink_id}/write/p{partition}/")
    return [(int(o.object_name.rsplit("/", 1)[-1].split(".")[0]), o.object_name) for o in objects]


def exists(sink_id: str, partition: int, version: int, s3: S3Settings) -> bool:
    """Whether checkpoint `version` exists (Arrow or legacy Parquet)."""
    client = _client(s3)
    for suffix in ("arrow", "parquet"):
        try:
            client.stat_object(s3.bucket, checkpoint_key(sink_id, partition, version, suffix))
            return True
        except S3Error as error:
            if error.code not in ("NoSuchKey", "NoSuchObject"):
                raise
    return False


#: How much of a checkpoint `read_meta` fetches: its Arrow schema message, metadata included.
META_PREFIX = 1 << 16


def read_meta(sink_id: str, partition: int, version: int, s3: S3Settings) -> dict[str, Any] | None:
    """Checkpoint `version`'s metadata (`since`, `folded_offset`, `desired_frontier`,
    `persist_folded`, `writer_id`) from the first bytes of its stream, without the data; None
    for no checkpoint (-1), a gone one, or a legacy Parquet one."""
    if version < 0:
        return None
    client, key = _client(s3), checkpoint_key(sink_id, partition, version)
    try:
        head = get_bytes(client, s3.bucket, key, length=META_PREFIX)
    except S3Error as error:
        if error.code in ("NoSuchKey", "NoSuchObject"):
            return None
        raise
    try:
        schema = pa.ipc.open_stream(head).schema
    except pa.ArrowInvalid:  # a schema larger than the prefix: read it all
        schema = pa.ipc.open_stream(get_bytes(client, s3.bucket, key)).schema
    meta: dict[str, Any] = json.loads(schema.metadata[b"mvsink.write"])
    return meta


def seed(
    sink_id: str,
    partition: int,
    s3: S3Settings,
    writer_id: str,
    row_schema: pa.Schema,
    frontier: Frontier,
    folded_offset: int,
    corrections: pa.Table | None = None,
) -> int | None:
    """Write the next checkpoint version of a partition whose desired records before
    `folded_offset` at times before `frontier` equal the shard's contents before `frontier`
    (`services.write.repair`): both inputs folded to `frontier`, `corrections` (desired
    updates at `frontier` or later that come before `folded_offset`) still to be written. Its
    version, or None if another writer created that version first."""
    correction = Correction(row_schema, frontier)
    if corrections is not None and corrections.num_rows:
        correction.insert(corrections)
    state = PartitionState(
        latest(sink_id, partition, s3), correction, folded_offset, frontier, frontier
    )
    saved = save(sink_id, partition, s3, writer_id, state, StateCache())
    return state.version if saved is not None else None


def empty(row_schema: pa.Schema, as_of: int, version: int) -> PartitionState:
    """Nothing folded yet: desired from offset 0, the shard from the start."""
    correction = Correction(row_schema, Frontier.at(as_of))
    return PartitionState(version, correction, 0, Frontier.minimum(), Frontier.minimum())


def load(
    sink_id: str,
    partition: int,
    version: int,
    s3: S3Settings,
    row_schema: pa.Schema,
    as_of: int,
    cache: StateCache,
) -> tuple[PartitionState, int]:
    """The state at checkpoint `version` (-1: none yet), and the bytes read from object storage
    to get it (0 when this executor holds it: in `cache`, or its warm copy, then kept in
    `cache`)."""
    cached = cache.states.get((sink_id, partition))
    if cached is not None and cached.version == version:
        return cached, 0
    warm = _load_warm(sink_id, partition, version)
    if warm is not None:
        cache.states[(sink_id, partition)] = warm
        return warm, 0
    if version < 0:
        return empty(row_schema, as_of, -1), 0
    table, legacy, size = _read(sink_id, partition, version, s3)
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
    )
    return state, size


def _warm_path(sink_id: str, partition: int) -> Path:
    return executor_dir() / "warm" / sink_id / f"p{partition}.pickle"


def _load_warm(sink_id: str, partition: int, version: int) -> PartitionState | None:
    """The executor's warm copy of the partition if it is at `version`."""
    try:
        with _warm_path(sink_id, partition).open("rb") as source:
            state = pickle.load(source)  # written by this executor's own Python workers
    except (OSError, EOFError, pickle.UnpicklingError):
        return None
    return state if isinstance(state, PartitionState) and state.version == version else None


def _save_warm(sink_id: str, partition: int, state: PartitionState | None) -> None:
    """Write (or, for None, drop) the executor's warm copy; atomic (write, then rename)."""
    path = _warm_path(sink_id, partition)
    if state is None:
        with contextlib.suppress(OSError):
            path.unlink()
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    with partial.open("wb") as out:
        pickle.dump(state, out, protocol=pickle.HIGHEST_PROTOCOL)
    partial.replace(path)


def keep(sink_id: str, partition: int, state: PartitionState, cache: StateCache) -> None:
    """Keep `state` in `cache` at its version, its warm copy written or due as
    `cache.warm_copies` says: after `save`, or for a step that checkpoints nothing (a
    partition's first fold, `services.write.task.StepSpec.checkpoint`). A state kept without a
    checkpoint has folded past the version it carries; a step that continues from that version
    folds on from where it is, and one that loads the checkpoint (or, at version -1, nothing)
    folds the difference again."""
    cache.states[(sink_id, partition)] = state
    if cache.warm_copies:
        _save_warm(sink_id, partition, state)
    else:
        cache.deferred.add((sink_id, partition))


def _read(sink_id: str, partition: int, version: int, s3: S3Settings) -> tuple[pa.Table, bool, int]:
    """Checkpoint `version`, whether it was a (legacy) Parquet one, and its size."""
    client = _client(s3)
    try:
        data = get_bytes(client, s3.bucket, checkpoint_key(sink_id, partition, version))
    except S3Error as error:
        if error.code != "NoSuchKey":
            raise
        legacy = get_bytes(
            client, s3.bucket, checkpoint_key(sink_id, partition, version, "parquet")
        )
        return pq.read_table(io.BytesIO(legacy)), True, len(legacy)
    return pa.ipc.open_stream(data).read_all(), False, len(data)


def save(
    sink_id: str,
    partition: int,
    s3: S3Settings,
    writer_id: str,
    state: PartitionState,
    cache: StateCache,
) -> int | None:
    """Write `state` as the next version, kept in `cache` (and its warm copy written, or due,
    as `cache.warm_copies` says); its size, or None if another owner wrote it first (then the
    partition is dropped from `cache` and its warm copy deleted)."""
    version = state.version + 1
    meta = {
        "since": state.correction.since.elements(),
        "folded_offset": state.folded_offset,
        "desired_frontier": state.desired_frontier.elements(),
        "persist_folded": state.persist_folded.elements(),
        "writer_id": writer_id,
    }
    table = state.correction.consolidate()
    data = updates_to_ipc(table.replace_schema_metadata({"mvsink.write": json.dumps(meta)}))
    client = _client(s3)
    key = checkpoint_key(sink_id, partition, version)
    if isinstance(conditional_put(client, s3.bucket, key, data), PreconditionFailed):
        cache.drop(sink_id, partition)
        _save_warm(sink_id, partition, None)
        return None
    state.version = version
    keep(sink_id, partition, state, cache)
    garbage = []
    if version >= 2:  # keep the previous version for a driver that has not seen this one
        garbage.append(checkpoint_key(sink_id, partition, version - 2))
    if state.legacy:  # the first Arrow checkpoint after Parquet ones: those are garbage now
        garbage += [
            checkpoint_key(sink_id, partition, v, "parquet") for v in (version - 1, version - 2)
        ]
        state.legacy = False
    _COLLECTOR.collect(s3, garbage)
    return len(data)


class _Collector:
    """Deletes superseded checkpoints off the step's path, on one thread of this process.

    Pure garbage collection: loads name an exact version, and the versions deleted are two
    behind one this owner created (or older, `collect_superseded`), which no step continues
    from: a driver that has not seen the newest expects the one before it. So nothing rests on
    when a delete runs. A process that pauses, or dies, with deletes queued leaves those
    objects behind until the partition's next owner starts (`collect_superseded`); a failed
    delete is logged and left to that too."""

    def __init__(self) -> None:
        self.queue: queue.Queue[tuple[S3Settings, str]] = queue.Queue()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def collect(self, s3: S3Settings, keys: list[str]) -> None:
        """Queue `keys` for deletion."""
        if not keys:
            return
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="checkpoint-gc", daemon=True)
                self.thread.start()
        for key in keys:
            self.queue.put((s3, key))

    def settle(self) -> None:
        """Wait until every queued delete has been tried."""
        self.queue.join()

    def _run(self) -> None:
        while True:
            s3, key = self.queue.get()
            try:
                _client(s3).remove_object(s3.bucket, key)
            except Exception as error:  # best effort: the next owner's collect_superseded
                log.warning("deleting superseded checkpoint %s failed: %r", key, error)
            finally:
                self.queue.task_done()


_COLLECTOR = _Collector()
settle = _COLLECTOR.settle


def collect_superseded(sink_id: str, partition: int, s3: S3Settings) -> int:
    """The partition's newest checkpoint version (-1: none), after deleting every version
    older than the one before it: what a process that died or paused with its deletes queued
    (`_Collector`) left behind, or a create that landed after its key was collected. For a
    driver gaining the partition; the two newest stay (`save`)."""
    found = _versions(sink_id, partition, s3)
    newest = max((version for version, _ in found), default=-1)
    old = [name for version, name in found if version < newest - 1]
    try:
        for name in old:
            _client(s3).remove_object(s3.bucket, name)
    except Exception as error:  # garbage only: the next owner tries again
        log.warning("partition %d: deleting superseded checkpoints failed: %r", partition, error)
    else:
        if old:
            log.info("partition %d: deleted %d superseded checkpoints", partition, len(old))
    return newest
