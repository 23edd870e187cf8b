"""Resident write tasks: one long-lived Spark task per executor core runs the driver's steps as
they come, so a batch description costs a round trip on a socket instead of a Spark job.

```
 write driver                          executor (one resident per core, pinned like a step)
 +-------+  one Spark job: the crew    +----------+
 | Crew  |───────────────────────────> | resident |── connects back, shows the crew's token
 |       |<══ [StepSpec] ══════════════|  serve() |   run_tasks(specs, worker): the same steps
 |       |══> [StepResult] or error ══>|          |   as a one-shot task (services.write.task)
 +-------+                             +----------+
```

A Spark job's scheduling, even of empty tasks, is a large share of a description's whole cycle
(mint -> write -> append -> mint), on top of the steps themselves; a round on a socket is not.

Rules
-----
1. A resident runs exactly `run_tasks`: the same loads, folds, stages and conditional
   checkpoints as a one-shot task, so every invariant of `services.write` holds unchanged.
   Its Python worker keeps the partitions' states in memory between steps, as a reused Python
   worker does for one-shot tasks, and a group of partitions goes to the same resident every
   round while the placement holds. Three differences, in speed only, all in the resident's
   own `services.write.task.WriteWorker` (`WriteWorker.resident()` of its Python worker's): it
   writes the executor's warm copies of its states when it leaves, not at every step; it
   keeps each partition's desired reader from step to step, so librdkafka fetches the next
   batch's records meanwhile; and it creates a pipelined staging step's checkpoint after the
   step reported (`services.write.state.Pipelined`), waiting for it in the partition's next step, or when
   it leaves.
2. Any trouble dismisses the whole crew and hands the groups it did not finish back to the
   caller, who runs them as one-shot Spark jobs (Spark retries those as before): a crew not
   connected within `READY_WAIT`, a broken connection (the resident's executor or Python worker
   died; TCP keepalive notices a host that vanished), an executor Spark declares lost, the
   crew's job ending, an exception in a step, a reply of another round. A step a lost resident
   half did is a lost task attempt: its checkpoint is conditional, and its unreported part is
   garbage for the sweeper. A retried resident task does not join (its crew has moved on), and
   the next crew waits `RELAUNCH_AFTER`, doubling with each failure in a row.
3. One-shot jobs are not started while the crew holds the slots (they would wait for slots
   that residents keep while waiting for work): the crew is dismissed and its job waited for
   first (`END_WAIT`, then cancelled, then `END_WAIT` again).
4. The crew holds every task slot, so it steps aside when another Spark job waits (the
   compactor's large merges): the driver's loop looks every `CHECK_EVERY`, and after each round,
   and the crew is launched again when no other job is active.
5. A driver launches the crew as it starts (`launch`), without waiting for it, so its first
   step does not pay for the crew's Spark job; later launches happen in `run`, as needed.

The connection is plain TCP on the driver's host (`mvsink.io.spark.driver_host`, where executors
already reach the driver), length-prefixed frames: first the crew's random token, which the
driver compares before it unpickles anything, then pickles both ways, each request and reply
numbered by its round. Residents do not authenticate the driver, and the frames (S3 settings
included) are not encrypted, as Spark's own RPC by default: keep `[spark] residents = false`
where Spark runs with authentication or encryption.
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

from mvsink.io.spark import executor_id, live_executors, run_pinned
from services.write.task import (
    PROCESS,
    StepResult,
    StepSpec,
    WriteWorker,
    preload,
    run_tasks,
)

log = logging.getLogger("mvsink.write.resident")

#: How long a launched crew may take to connect before the round runs as one-shot jobs.
READY_WAIT = 20.0
#: How long a resident tries to connect (less than `READY_WAIT`: it gives up before the crew).
CONNECT_TIMEOUT = 10.0
#: How long after a failed crew the next is launched, doubling with each failure in a row.
RELAUNCH_AFTER = 30.0
RELAUNCH_MAX = 600.0
#: How long a dismissed crew's job may take to end before it is cancelled.
END_WAIT = 10.0
#: How often a waiting round checks that its residents' executors live, and how often an idle
#: crew looks for another Spark job to step aside for (rule 4).
CHECK_EVERY = 1.0
_JOB_GROUP = "mvsink-write-residents"
_HEADER = struct.Struct("!Q")
#: A joining resident's frames: the token (exactly `_TOKEN` bytes), then a small hello.
_TOKEN = 32
_HELLO_MAX = 4096

#: A group of partitions' specs and the executor they should run on (`affinity.groups`).
Work = tuple[list[StepSpec], str]


@dataclass(frozen=True)
class ResidentSpec:
    """What a resident needs to join its crew (pickled to the executor)."""

    address: tuple[str, int]
    token: bytes
    slot: int


# -- the executor side ----------------------------------------------------------------------


def serve(spec: ResidentSpec) -> list[str]:
    """Join the crew at `spec.address` and run each round of specs it sends, until it sends
    None or goes away, then write the warm copies it deferred; nothing to return to Spark, and
    no error of the crew's raised (a failed resident task would be retried, and a retry finds
    its crew gone). A retried attempt does not join."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is not None and context.attemptNumber() > 0:
        return []
    preload()  # a no-op in a worker the driver's warm-up ran in
    try:
        conn = socket.create_connection(spec.address, timeout=CONNECT_TIMEOUT)
    except OSError:
        return []
    worker = PROCESS.worker().resident()
    try:
        return _serve(spec, conn, worker)
    finally:  # this Python worker may run one-shot tasks next: they share through warm copies
        worker.leave()


def _serve(spec: ResidentSpec, conn: socket.socket, worker: WriteWorker) -> list[str]:
    with conn:
        try:
            keep_alive(conn)
            conn.settimeout(None)
            send_frame(conn, spec.token)
            send_frame(conn, pickle.dumps((spec.slot, executor_id(), os.getpid())))
            while True:
                request = pickle.loads(recv_frame(conn))
                if request is None:
                    return []
                number, specs = request
                try:
                    reply: tuple[int, str, Any] = (number, "ok", run_tasks(specs, worker))
                except Exception:  # reported: the driver runs the group as a one-shot job
                    reply = (number, "error", traceback.format_exc())
                send_frame(conn, pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))
        except (EOFError, OSError):  # the crew went away
            return []


def keep_alive(conn: socket.socket) -> None:
    """TCP keepalive: a peer whose host died or was cut off is noticed in ~25 s."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, option):
            conn.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def send_frame(conn: socket.socket, data: bytes) -> None:
    conn.sendall(_HEADER.pack(len(data)) + data)


def recv_frame(conn: socket.socket, limit: int | None = None) -> bytes:
    """One frame; EOFError when the peer closed the connection, ValueError when it is longer
    than `limit`."""
    (size,) = _HEADER.unpack(_exactly(conn, _HEADER.size))
    if limit is not None and size > limit:
        raise ValueError(f"a frame of {size} bytes, more than {limit}")
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
    """The driver's residents (module docs). `run` and `maybe_step_aside` are called from one
    thread only."""

    def __init__(self, spark: Any, host: str) -> None:
        self.spark = spark
        #: Where the residents connect to (`mvsink.io.spark.driver_host`).
        self.host = host
        self.lock = threading.Lock()
        self.residents: list[_Resident] = []
        self.job: threading.Thread | None = None
        self.closed = threading.Event()
        self.launched_at = 0.0
        self.not_before = 0.0
        #: Failed crews in a row (the relaunch backs off).
        self.failures = 0
        #: How many residents the crew was launched with.
        self.expected = 0
        #: Where the crew listens for its residents (while launched).
        self.address: tuple[str, int] | None = None
        #: Rounds sent: each request and reply carries its number.
        self.rounds = 0
        self.next_check = 0.0

    # -- rounds ---------------------------------------------------------------------------

    def run(
        self, work: Sequence[Work], executors: Sequence[str], slots: int
    ) -> tuple[list[StepResult], list[Work]]:
        """Run what the crew can of `work` (launching it if it is down and may be); the results,
        and the work left for one-shot jobs. `executors` and `slots` are the live executors and
        the task slots of each, as the caller placed `work` by."""
        try:
            if not self._ready(work, executors, slots):
                return [], list(work)
        except Exception as error:  # e.g. Spark refusing the crew's job: one-shot jobs serve
            log.warning("the residents could not be launched: %r", error)
            self.dismiss(failed=True)
            return [], list(work)
        results, left = self._round(work)
        if left:
            self.dismiss(failed=True)
        else:
            self.failures = 0
            self.maybe_step_aside(force=True)
        return results, left

    def _round(self, work: Sequence[Work]) -> tuple[list[StepResult], list[Work]]:
        self.rounds += 1
        results: list[StepResult] = []
        left: list[Work] = []
        waiting: dict[socket.socket, tuple[_Resident, list[Work]]] = {}
        for resident, items in self.assign(work):
            specs = [spec for item in items for spec in item[0]]
            try:
                send_frame(
                    resident.conn, pickle.dumps((self.rounds, specs), pickle.HIGHEST_PROTOCOL)
                )
                waiting[resident.conn] = (resident, items)
            except OSError as error:
                log.warning("resident %s/%d is gone (%r)", resident.executor, resident.slot, error)
                left.extend(items)
        next_check = time.monotonic() + CHECK_EVERY
        while waiting:
            ready, _, _ = select.select(list(waiting), [], [], CHECK_EVERY)
            for conn in ready:
                resident, items = waiting.pop(conn)
                partitions = [spec.partition for item in items for spec in item[0]]
                try:
                    number, status, reply = pickle.loads(recv_frame(conn))
                    if number != self.rounds:
                        raise ValueError(f"the reply of round {number} in round {self.rounds}")
                except Exception as error:  # EOF: its executor or Python worker died
                    log.warning(
                        "resident %s/%d failed (%r): partitions %s run as a one-shot job",
                        resident.executor,
                        resident.slot,
                        error,
                        partitions,
                    )
                    left.extend(items)
                    continue
                if status == "ok":
                    results.extend(reply)
                else:
                    log.warning(
                        "a step failed in resident %s/%d; partitions %s run as a one-shot job:\n%s",
                        resident.executor,
                        resident.slot,
                        partitions,
                        reply,
                    )
                    left.extend(items)
            if waiting and time.monotonic() >= next_check:
                next_check = time.monotonic() + CHECK_EVERY
                for conn in self._lost(waiting):
                    resident, items = waiting.pop(conn)
                    log.warning(
                        "resident %s/%d is lost (its executor, or the crew's job, ended)",
                        resident.executor,
                        resident.slot,
                    )
                    left.extend(items)
        return results, left

    def _lost(
        self, waiting: dict[socket.socket, tuple[_Resident, list[Work]]]
    ) -> list[socket.socket]:
        """The connections among `waiting` that can no longer answer: all of them when the
        crew's job has ended, else those whose executor Spark lost (a host that died sends no
        FIN; Spark declares its executor lost)."""
        if self.closed.is_set():
            return list(waiting)
        try:
            live = live_executors(self.spark)
        except Exception:  # the driver's Spark is going away: the job ends and closes
            return []
        return [conn for conn, (resident, _) in waiting.items() if resident.executor not in live]

    def launch(self, executors: Sequence[str], slots: int) -> None:
        """Launch the crew if it is down and may be (rules 3 and 4), without waiting for it to
        connect: a driver starting calls it before its first step, so that step (a new sink's
        hydration) does not wait for the Spark job that starts the residents. A launch that
        fails is left to the first `run`, which tries again."""
        if self.job is not None:
            return
        try:
            self._maybe_launch(executors, slots)
        except Exception as error:
            log.warning("launching the residents failed (the first round tries again): %r", error)

    def _maybe_launch(self, executors: Sequence[str], slots: int) -> bool:
        """Launch the crew unless it waits out a failure (`not_before`) or another Spark job
        waits for the slots (rules 2 and 4); whether it launched."""
        if time.monotonic() < self.not_before or self._others_waiting():
            return False
        self._launch(executors, slots)
        return True

    def _ready(self, work: Sequence[Work], executors: Sequence[str], slots: int) -> bool:
        """Whether the crew is up with a resident on every executor of `work`, launching it and
        waiting for it if it may (rules 3 and 4)."""
        if self.job is not None and self.closed.is_set():
            log.warning("the residents' Spark job ended: this round runs as a one-shot job")
            self.dismiss(failed=True)
            return False
        if self.job is not None and self._complete() and not self._covers(work):
            log.info("the executors changed under the residents: launching them again")
            self.dismiss()
        if self.job is None and not self._maybe_launch(executors, slots):
            return False
        deadline = self.launched_at + READY_WAIT
        while not self._complete() and not self.closed.is_set() and time.monotonic() < deadline:
            time.sleep(0.005)
        if self.closed.is_set() or not self._covers(work):
            log.warning(
                "the residents did not connect within %.0fs (%d of %d, executors %s "
                "needed): this round runs as a one-shot job",
                READY_WAIT,
                len(self.residents),
                self.expected,
                sorted({executor for _, executor in work}),
            )
            self.dismiss(failed=True)
            return False
        return True

    def _complete(self) -> bool:
        with self.lock:
            return len(self.residents) == self.expected

    def _covers(self, work: Sequence[Work]) -> bool:
        with self.lock:
            have = {resident.executor for resident in self.residents}
        return all(executor in have for _, executor in work)

    def assign(self, work: Sequence[Work]) -> list[tuple[_Resident, list[Work]]]:
        """Each resident's share of `work`: the k-th group of an executor goes to its resident
        k (by slot, modulo how many it has), so a group meets the same resident every round
        while the placement holds (rule 1)."""
        with self.lock:
            by_executor: dict[str, list[_Resident]] = {}
            for resident in sorted(self.residents, key=lambda r: r.slot):
                by_executor.setdefault(resident.executor, []).append(resident)
        taken: dict[str, int] = {}
        shares: dict[int, tuple[_Resident, list[Work]]] = {}
        for item in work:
            k = taken.get(item[1], 0)
            taken[item[1]] = k + 1
            candidates = by_executor[item[1]]
            resident = candidates[k % len(candidates)]
            shares.setdefault(resident.slot, (resident, []))[1].append(item)
        return list(shares.values())

    # -- the crew's job -------------------------------------------------------------------

    def _launch(self, executors: Sequence[str], slots: int) -> None:
        host = self.host
        server = socket.create_server((host if host.startswith("127.") else "0.0.0.0", 0))
        server.settimeout(0.2)
        token = secrets.token_bytes(_TOKEN)
        address = (host, server.getsockname()[1])
        work = [
            (ResidentSpec(address, token, i), executor)
            for i, executor in enumerate(e for e in executors for _ in range(slots))
        ]
        members: list[_Resident] = []
        closed = threading.Event()
        self.residents, self.closed, self.address = members, closed, address
        self.expected = len(work)
        self.launched_at = time.monotonic()
        threading.Thread(
            target=self._accept,
            args=(server, token, members, closed),
            name="write-residents-accept",
            daemon=True,
        ).start()
        self.job = threading.Thread(
            target=self._job, args=(work, closed), name="write-residents", daemon=True
        )
        self.job.start()
        log.info(
            "launching %d residents on %s at %s:%d", len(work), sorted(set(executors)), *address
        )

    def _job(self, work: list[tuple[ResidentSpec, str]], closed: threading.Event) -> None:
        sc = self.spark.sparkContext
        sc.setJobGroup(_JOB_GROUP, "mvsink write residents", interruptOnCancel=True)
        try:
            run_pinned(self.spark, work, serve)
        except Exception as error:  # an executor lost, the job cancelled: rule 2
            if not closed.is_set():
                log.warning("the residents' Spark job failed: %r", error)
        finally:
            closed.set()

    def _accept(
        self, server: socket.socket, token: bytes, members: list[_Resident], closed: threading.Event
    ) -> None:
        """Admit residents presenting `token`, one per slot, until the crew is dismissed."""
        with server:
            while not closed.is_set():
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return
                try:
                    conn.settimeout(2)
                    if not hmac.compare_digest(recv_frame(conn, _TOKEN), token):
                        raise PermissionError("wrong token")
                    slot, executor, pid = pickle.loads(recv_frame(conn, _HELLO_MAX))
                    keep_alive(conn)
                    conn.settimeout(None)
                    with self.lock:
                        if closed.is_set() or any(m.slot == slot for m in members):
                            raise PermissionError(f"slot {slot} has joined, or the crew left")
                        members.append(_Resident(int(slot), str(executor), int(pid), conn))
                except Exception as error:
                    log.warning("refused a connection to the residents' port: %r", error)
                    conn.close()

    def maybe_step_aside(self, force: bool = False) -> None:
        """Dismiss the crew when another Spark job waits for its slots (rule 4); at most every
        `CHECK_EVERY` unless `force`."""
        now = time.monotonic()
        if self.job is None or (not force and now < self.next_check):
            return
        self.next_check = now + CHECK_EVERY
        if self._others_waiting():
            log.info("another Spark job waits for task slots: the residents step aside")
            self.dismiss()

    def _others_waiting(self) -> bool:
        """Whether a Spark job other than the crew's is active (rule 4)."""
        try:
            tracker = self.spark.sparkContext.statusTracker()
            ours = set(tracker.getJobIdsForGroup(_JOB_GROUP))
            return any(job not in ours for job in tracker.getActiveJobsIds())
        except Exception:  # Spark going away: nothing to step aside for
            return False

    def dismiss(self, failed: bool = False) -> None:
        """Send the residents home and wait for the crew's job to end (rule 3); after a failure
        the next crew waits `RELAUNCH_AFTER`, doubling with each failure in a row."""
        job, self.job = self.job, None
        self.closed.set()
        with self.lock:
            residents, self.residents = self.residents, []
        for resident in residents:
            with contextlib.suppress(OSError):
                send_frame(resident.conn, pickle.dumps(None))
            resident.conn.close()
        if failed:
            self.failures += 1
            pause = min(RELAUNCH_MAX, RELAUNCH_AFTER * 2 ** (self.failures - 1))
            self.not_before = time.monotonic() + pause
            log.warning(
                "the residents are dismissed after a failure; the next crew in %.0fs "
                "(failure %d in a row)",
                pause,
                self.failures,
            )
        if job is None:
            return
        job.join(END_WAIT)
        if job.is_alive():
            log.warning(
                "the residents' Spark job did not end within %.0fs: cancelling it", END_WAIT
            )
            self.spark.sparkContext.cancelJobGroup(_JOB_GROUP)
            job.join(END_WAIT)
            if job.is_alive():
                log.error(
                    "the residents' Spark job is still running after its cancel: "
                    "one-shot jobs may wait for its slots"
                )


class SharedCrew:
    """One crew for every sink's driver of a write host (`services.write.shell.host`): their
    rounds take turns (`Crew` runs one at a time: a round of one sink's steps runs on the
    residents while the other drivers wait for them). A driver joins it when it starts and
    leaves it when it stops; the crew stays for the others and goes home with the last one,
    since only a running driver's loop steps it aside (rule 4) for a Spark job that waits for its
    slots, such as a new sink's warm-up. The host sends it home when it stops (`close`). The
    residents keep each sink's partitions apart as one-shot tasks do (states by sink and
    partition)."""

    def __init__(self, crew: Crew) -> None:
        self.crew = crew
        self.turn = threading.Lock()
        #: Drivers that joined and have not left.
        self.drivers = 0

    def join(self) -> None:
        """A driver starting to use the crew."""
        with self.turn:
            self.drivers += 1

    def run(
        self, work: Sequence[Work], executors: Sequence[str], slots: int
    ) -> tuple[list[StepResult], list[Work]]:
        with self.turn:
            return self.crew.run(work, executors, slots)

    def launch(self, executors: Sequence[str], slots: int) -> None:
        with self.turn:
            self.crew.launch(executors, slots)

    def maybe_step_aside(self, force: bool = False) -> None:
        """`Crew.maybe_step_aside`, unless another driver's round is under way (it steps aside
        after that round, when another job waits)."""
        if self.turn.acquire(blocking=False):
            try:
                self.crew.maybe_step_aside(force)
            finally:
                self.turn.release()

    def dismiss(self, failed: bool = False) -> None:
        """A driver leaving: the crew stays for the others, and goes home with the last."""
        with self.turn:
            self.drivers -= 1
            if self.drivers == 0:
                self.crew.dismiss(failed)

    def close(self) -> None:
        with self.turn:
            self.crew.dismiss()
