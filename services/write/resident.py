"""Resident write tasks: one long-lived Spark task per executor core runs the driver's steps as
they come, so a batch description costs a round trip on a socket instead of a Spark job.

```
 write driver                          executor (one resident per core, pinned like a step)
 +-------+  one Spark job: the crew    +----------+
 | Crew  |───────────────────────────> | resident |── connects back, shows the crew's token
 |       |<══ [TaskSpec] ══════════════|  serve() |   run_tasks(specs): the same steps as a
 |       |══> [TaskResult] or error ══>|          |   one-shot task (services.write.task)
 +-------+                             +----------+
```

An empty two-task Spark job costs 0.15-0.24 s here, about a third of a description's whole
cycle (mint -> write -> append -> mint), on top of the steps themselves.

Rules
-----
1. A resident runs exactly `run_tasks`: the same loads, folds, stages and conditional
   checkpoints as a one-shot task, so every invariant of `services.write` holds unchanged.
   Its Python worker keeps the partitions' states in memory between steps, as a reused Python
   worker did, and a group of partitions goes to the same resident every time while the
   placement holds.
2. Any trouble dismisses the whole crew and hands the groups it did not finish back to the
   caller, who runs them as one-shot Spark jobs (Spark retries those as before): a crew not
   connected within `READY_WAIT`, a broken connection (the resident's executor or Python worker
   died), an exception in a step. A step a lost resident half did is a lost task attempt: its
   checkpoint is conditional, and its unreported part is garbage for the sweeper.
3. One-shot jobs never run while the crew holds the slots (they would wait for slots that
   residents keep while waiting for work): the crew is dismissed, and its job has ended, first.
4. The crew holds every task slot, so it steps aside when another Spark job waits (the
   compactor's large merges): it is dismissed after the round that sees one, and launched again
   when no other job is active, no sooner than `RELAUNCH_AFTER` after a failure.

The connection is plain TCP on the driver's host (`mvsink.spark.driver_host`, where executors
already reach the driver), length-prefixed frames: first the crew's random token, compared
before anything is unpickled, then pickles both ways.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import pickle
import secrets
import select
import socket
import struct
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mvsink.spark import driver_host, executor_id, run_pinned
from services.write.task import TaskResult, TaskSpec, run_tasks

log = logging.getLogger("mvsink.write.resident")

#: How long a launched crew may take to connect before the round runs as one-shot jobs.
READY_WAIT = 20.0
#: How long after a failed or timed-out crew the next is launched.
RELAUNCH_AFTER = 30.0
#: How long a dismissed crew's job may take to end before it is cancelled.
END_WAIT = 10.0
_JOB_GROUP = "mvsink-write-residents"
_HEADER = struct.Struct("!Q")

#: A group of partitions' specs and the executor they should run on (`affinity.groups`).
Work = tuple[list[TaskSpec], str]


@dataclass(frozen=True)
class ResidentSpec:
    """What a resident needs to join its crew (pickled to the executor)."""

    address: tuple[str, int]
    token: bytes
    slot: int


# -- the executor side ----------------------------------------------------------------------


def serve(spec: ResidentSpec) -> list[str]:
    """Join the crew at `spec.address` and run each group of specs it sends until it sends None
    or goes away; nothing to return to Spark."""
    with socket.create_connection(spec.address, timeout=30) as conn:
        conn.settimeout(None)
        send_frame(conn, spec.token)
        send_frame(conn, pickle.dumps((spec.slot, executor_id(), os.getpid())))
        while True:
            try:
                specs = pickle.loads(recv_frame(conn))
            except (EOFError, OSError):
                return []
            if specs is None:
                return []
            try:
                reply: tuple[str, Any] = ("ok", run_tasks(specs))
            except Exception:  # reported: the driver runs the group again as a one-shot job
                reply = ("error", traceback.format_exc())
            send_frame(conn, pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))


def send_frame(conn: socket.socket, data: bytes) -> None:
    conn.sendall(_HEADER.pack(len(data)) + data)


def recv_frame(conn: socket.socket) -> bytes:
    """One frame; EOFError when the peer closed the connection."""
    (size,) = _HEADER.unpack(_exactly(conn, _HEADER.size))
    return _exactly(conn, size)


def _exactly(conn: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("connection closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# -- the driver side ------------------------------------------------------------------------


@dataclass
class _Resident:
    slot: int
    executor: str
    pid: int
    conn: socket.socket


class Crew:
    """The driver's residents (module docs). `run` is called from one thread only."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.lock = threading.Lock()
        self.residents: list[_Resident] = []
        self.job: threading.Thread | None = None
        self.closed = threading.Event()
        self.launched_at = 0.0
        self.not_before = 0.0
        #: How many residents the crew was launched with.
        self.expected = 0
        #: Where the crew listens for its residents (while launched).
        self.address: tuple[str, int] | None = None

    # -- rounds ---------------------------------------------------------------------------

    def run(self, work: Sequence[Work], executors: Sequence[str], slots: int
            ) -> tuple[list[TaskResult], list[Work]]:  # fmt: skip
        """Run what the crew can of `work` (launching it if it is down and may be); the results,
        and the work left for one-shot jobs. `executors` and `slots` are the live executors and
        the task slots of each, as the caller placed `work` by."""
        if not self._ready(work, executors, slots):
            return [], list(work)
        assigned = self.assign(work)
        results: list[TaskResult] = []
        left: list[Work] = []
        waiting: dict[socket.socket, Work] = {}
        for item, resident in assigned:
            try:
                send_frame(resident.conn, pickle.dumps(item[0], pickle.HIGHEST_PROTOCOL))
                waiting[resident.conn] = item
            except OSError as error:
                log.warning("resident %s/%d is gone (%r)", resident.executor, resident.slot, error)
                left.append(item)
        while waiting:
            ready, _, _ = select.select(list(waiting), [], [])
            for conn in ready:
                item = waiting.pop(conn)
                try:
                    status, reply = pickle.loads(recv_frame(conn))
                except (EOFError, OSError) as error:
                    log.warning("a resident's connection broke (its executor or Python worker "
                                "died?): %r; partitions %s run as a one-shot job",
                                error, [s.partition for s in item[0]])  # fmt: skip
                    left.append(item)
                    continue
                if status == "ok":
                    results.extend(reply)
                else:
                    log.warning("a resident's step failed; partitions %s run as a one-shot "
                                "job:\n%s", [s.partition for s in item[0]], reply)  # fmt: skip
                    left.append(item)
        if left:
            self.dismiss(failed=True)
        elif self._others_waiting():
            log.info("another Spark job waits for task slots: the residents step aside")
            self.dismiss()
        return results, left

    def _ready(self, work: Sequence[Work], executors: Sequence[str], slots: int) -> bool:
        """Whether the crew is up with a resident for every group of `work`, launching it and
        waiting for it if it may (rules 3 and 4)."""
        if self.job is not None and self._complete() and not self._covers(work):
            log.info("the executors changed under the residents: launching them again")
            self.dismiss()
        if self.job is None:
            now = time.monotonic()
            if now < self.not_before or self._others_waiting():
                return False
            self._launch(executors, slots)
        deadline = self.launched_at + READY_WAIT
        while not self._covers(work):
            if self.job is None or not self.job.is_alive() or time.monotonic() > deadline:
                log.warning("the residents did not all connect within %.0fs (%d of %d): this "
                            "round runs as one-shot jobs", READY_WAIT, len(self.residents),
                            len(executors) * slots)  # fmt: skip
                self.dismiss(failed=True)
                return False
            time.sleep(0.005)
        return True

    def _complete(self) -> bool:
        with self.lock:
            return len(self.residents) == self.expected

    def _covers(self, work: Sequence[Work]) -> bool:
        with self.lock:
            have: dict[str, int] = {}
            for resident in self.residents:
                have[resident.executor] = have.get(resident.executor, 0) + 1
        need: dict[str, int] = {}
        for _, executor in work:
            need[executor] = need.get(executor, 0) + 1
        return all(have.get(e, 0) >= n for e, n in need.items())

    def assign(self, work: Sequence[Work]) -> list[tuple[Work, _Resident]]:
        """The k-th group of an executor to its k-th resident by slot (rule 1: stable)."""
        with self.lock:
            by_executor: dict[str, list[_Resident]] = {}
            for resident in sorted(self.residents, key=lambda r: r.slot):
                by_executor.setdefault(resident.executor, []).append(resident)
        taken: dict[str, int] = {}
        assigned = []
        for item in work:
            k = taken.get(item[1], 0)
            taken[item[1]] = k + 1
            assigned.append((item, by_executor[item[1]][k]))
        return assigned

    # -- the crew's job -------------------------------------------------------------------

    def _launch(self, executors: Sequence[str], slots: int) -> None:
        host = driver_host()
        server = socket.create_server((host if host.startswith("127.") else "0.0.0.0", 0))
        server.settimeout(0.2)
        token = secrets.token_bytes(32)
        address = (host, server.getsockname()[1])
        work = [(ResidentSpec(address, token, i), executor)
                for i, executor in enumerate(e for e in executors for _ in range(slots))]  # fmt: skip
        self.residents, self.closed, self.address = [], threading.Event(), address
        self.expected = len(work)
        self.launched_at = time.monotonic()
        threading.Thread(target=self._accept, args=(server, token, self.closed),
                         name="write-residents-accept", daemon=True).start()  # fmt: skip
        self.job = threading.Thread(target=self._job, args=(work,), name="write-residents",
                                    daemon=True)  # fmt: skip
        self.job.start()
        log.info("launching %d residents on %s at %s:%d", len(work), sorted(set(executors)),
                 *address)  # fmt: skip

    def _job(self, work: list[tuple[ResidentSpec, str]]) -> None:
        sc = self.spark.sparkContext
        sc.setJobGroup(_JOB_GROUP, "mvsink write residents", interruptOnCancel=True)
        try:
            run_pinned(self.spark, work, serve)
        except Exception as error:  # an executor lost, the job cancelled: rule 2
            if not self.closed.is_set():
                log.warning("the residents' Spark job failed: %r", error)
        finally:
            self.closed.set()

    def _accept(self, server: socket.socket, token: bytes, closed: threading.Event) -> None:
        """Admit residents presenting `token` until the crew is dismissed."""
        with server:
            while not closed.is_set():
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return
                try:
                    conn.settimeout(10)
                    if not hmac.compare_digest(recv_frame(conn), token):
                        raise PermissionError("wrong token")
                    slot, executor, pid = pickle.loads(recv_frame(conn))
                    conn.settimeout(None)
                except (OSError, EOFError, PermissionError, pickle.UnpicklingError) as error:
                    log.warning("refused a connection to the residents' port: %r", error)
                    conn.close()
                    continue
                with self.lock:
                    self.residents.append(_Resident(int(slot), str(executor), int(pid), conn))

    def _others_waiting(self) -> bool:
        """Whether a Spark job other than the crew's is active (rule 4)."""
        tracker = self.spark.sparkContext.statusTracker()
        ours = set(tracker.getJobIdsForGroup(_JOB_GROUP))
        return any(job not in ours for job in tracker.getActiveJobsIds())

    def dismiss(self, failed: bool = False) -> None:
        """Send the residents home and wait for the crew's job to end (rule 3)."""
        job, self.job = self.job, None
        self.closed.set()
        with self.lock:
            residents, self.residents = self.residents, []
        for resident in residents:
            with contextlib.suppress(OSError):
                send_frame(resident.conn, pickle.dumps(None))
            resident.conn.close()
        if failed:
            self.not_before = time.monotonic() + RELAUNCH_AFTER
        if job is None:
            return
        job.join(END_WAIT)
        if job.is_alive():
            log.warning("the residents' Spark job did not end within %.0fs: cancelling it",
                        END_WAIT)  # fmt: skip
            self.spark.sparkContext.cancelJobGroup(_JOB_GROUP)
            job.join(END_WAIT)
