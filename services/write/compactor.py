"""The write driver's compactor: a background thread that keeps the shard small
(`mvsink.shard.compact` has the picture and the invariants of a merge).

```
 write driver ── poke() after each staging job ──> +-----------+  compact_once: merges as the
   owns desired partition 0 -> enabled             | compactor |  policy asks (small ones here,
                                                   |  thread   |  large ones on Spark executors)
                                                   +-----------+  collect_garbage every GC_INTERVAL
                                                                  sweep every min_grace
```

Only the driver owning desired partition 0 runs it, so one compactor runs per sink replica. It
collects garbage in every replica, read-only ones and those with `[shard] compaction` off
included: the state log's bound (each lease renewal and hold move is a version) must not depend
on which replica merges, nor on whether any does. It merges only in a writing replica with
compaction on (`merging`). Two replicas on one shard (or an operator's `mvsink shard compact`)
are safe: a merge whose inputs another one took is refused and its outputs deleted, and a
version another collector pruned meanwhile ends a collection early. Merging and collecting garbage fail
apart (a merge that keeps failing, e.g. a lost Spark job, does not stop the deletion of what
earlier merges replaced). The thread never stops the driver: an unavailable S3 is logged once
when it starts failing and once when it recovers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from mvsink.io.config import Config
from mvsink.shard import Merged, open_shard
from mvsink.shard.compact import CompactionOutcome, compact_once, run_locally, spark_runner

log = logging.getLogger("mvsink.write.compactor")

#: How often the thread looks for a merge without being poked, and collects garbage: while the
#: shard changes, and once a round saw the same state version as the round before (idle). An
#: idle shard has nothing new to merge; what garbage collection deletes by age (replaced parts,
#: superseded versions) goes at most `IDLE_INTERVAL` later than its grace.
COMPACT_INTERVAL = 1.0
GC_INTERVAL = 1.0
IDLE_INTERVAL = 10.0
#: The first sweep (parts a crash leaked before this driver started) this long after the start;
#: later ones every `Timing.min_grace`, the age a leaked part must reach to be deleted.
FIRST_SWEEP = 30.0
#: Merges per round at most, so a backlog does not starve garbage collection.
MERGES_PER_ROUND = 4

MERGES = Counter("mvsink_compact_merges", "Merges by outcome", ["sink", "outcome"])
BYTES_IN = Counter("mvsink_compact_bytes_in", "Part bytes read by merges", ["sink"])
BYTES_OUT = Counter("mvsink_compact_bytes_out", "Part bytes written by merges", ["sink"])
SECONDS = Histogram(
    "mvsink_compact_seconds", "Merge duration (plan to compare-and-merge)", ["sink"]
)
LIVE_BATCHES = Gauge("mvsink_shard_live_batches", "Live batches in the shard", ["sink"])
LIVE_PARTS = Gauge("mvsink_shard_live_parts", "Parts of the live batches", ["sink"])
LIVE_BYTES = Gauge("mvsink_shard_live_bytes", "Bytes of the live parts", ["sink"])
SINCE_LAG = Gauge("mvsink_shard_since_lag", "Times between the shard's since and upper", ["sink"])
GC_PARTS = Counter("mvsink_gc_parts_deleted", "Replaced parts deleted", ["sink"])
GC_VERSIONS = Counter("mvsink_gc_versions_pruned", "Superseded state versions pruned", ["sink"])


class Compactor:
    """The compaction thread of one write driver."""

    def __init__(self, config: Config, writer_id: str, spark: Any) -> None:
        self.config = config
        self.writer_id = writer_id
        self.shard = open_shard(config.shard_id, None, config.s3, config.shard_timing())
        self.policy = config.compaction_policy()
        # Large merges go to the executors of a cluster. On `local[*]` the executors are this
        # machine's cores, where a merge job would hold every task slot while staging jobs
        # wait behind it; the driver's idle-priority threads give the cores up at once instead.
        local = spark is None or str(spark.sparkContext.master).startswith("local")
        self.large = None if local else spark_runner(spark)
        #: Set while this driver owns desired partition 0: garbage is collected.
        self.enabled = threading.Event()
        #: Set while the replica writes and `[shard] compaction` is on: batches are merged too.
        self.merging = threading.Event()
        self._kick = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="compactor", daemon=True)
        self._failing: set[str] = set()
        self._next_gc = 0.0
        self._next_sweep = time.monotonic() + FIRST_SWEEP
        #: The state version the last round saw, and whether it was new then.
        self._seen, self._changed = -1, True

    def start(self) -> None:
        """Start the thread (it idles until `enabled`)."""
        self._thread.start()

    def poke(self) -> None:
        """Look for a merge now (the shard just grew)."""
        self._kick.set()

    def stop(self) -> None:
        """Stop after the current step."""
        self._stopping.set()
        self._kick.set()
        self._thread.join(timeout=60)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._kick.wait(COMPACT_INTERVAL if self._changed else IDLE_INTERVAL)
            self._kick.clear()
            if not self.enabled.is_set() or self._stopping.is_set():
                continue
            if self.merging.is_set():
                self._attempt("compaction", self.merge)
            self._attempt("garbage collection", self.collect)

    def _attempt(self, what: str, step: Callable[[], None]) -> None:
        """Run `step`; an error (S3 unavailable, a lost Spark job) is retried next round and
        logged when `what` starts failing and when it recovers."""
        try:
            step()
        except Exception as error:
            if what not in self._failing:
                log.warning("%s failing (retrying every %.0fs): %r", what, COMPACT_INTERVAL, error)
            self._failing.add(what)
        else:
            if what in self._failing:
                log.info("%s recovered", what)
            self._failing.discard(what)

    def merge(self) -> None:
        """Up to `MERGES_PER_ROUND` merges as the policy asks."""
        for _ in range(MERGES_PER_ROUND):
            outcome = compact_once(
                self.shard, self.policy, self.writer_id, run_locally, large=self.large
            )
            if outcome is None:
                break
            self._record(outcome)

    def collect(self) -> None:
        """Garbage collection every `GC_INTERVAL`, the sweep when due, and the shard gauges."""
        sink = self.config.sink_id
        now = time.monotonic()
        if now >= self._next_gc:
            collected = self.shard.collect_garbage()
            GC_PARTS.labels(sink).inc(len(collected.parts_deleted))
            GC_VERSIONS.labels(sink).inc(len(collected.states_pruned))
            self._next_gc = now + GC_INTERVAL
        if now >= self._next_sweep:
            swept = self.shard.sweep(self.shard.timing.min_grace)
            if swept.parts_deleted:
                log.info("sweep deleted %d leaked parts", len(swept.parts_deleted))
            self._next_sweep = now + self.shard.timing.min_grace
        state = self.shard.state()
        self._changed, self._seen = state.seqno != self._seen, state.seqno
        LIVE_BATCHES.labels(sink).set(len(state.batches))
        LIVE_PARTS.labels(sink).set(len(state.part_keys))
        LIVE_BYTES.labels(sink).set(state.total_bytes())
        if state.upper.time is not None and state.since.time is not None:
            SINCE_LAG.labels(sink).set(state.upper.time - state.since.time)

    def _record(self, outcome: CompactionOutcome) -> None:
        sink, request = self.config.sink_id, outcome.request
        merged = isinstance(outcome.result, Merged)
        MERGES.labels(sink, "merged" if merged else "refused").inc()
        BYTES_IN.labels(sink).inc(outcome.bytes_in)
        BYTES_OUT.labels(sink).inc(outcome.bytes_out)
        SECONDS.labels(sink).observe(outcome.seconds)
        log.info(
            "%s merge (%s) of %d batches [%s, %s) at since %s (%s): %d -> %d updates, "
            "%d -> %d bytes in %.2fs",
            "committed" if merged else "refused",
            request.reason,
            len(request.inputs),
            request.lower,
            request.upper,
            request.since,
            outcome.where,
            request.updates,
            outcome.updates_out,
            outcome.bytes_in,
            outcome.bytes_out,
            outcome.seconds,
        )
