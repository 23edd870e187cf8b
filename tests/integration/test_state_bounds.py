"""The shard's state log stays bounded whichever replica runs: a writing replica with
`[shard] compaction = false` and a read-only standby on its shard (the two setups where nothing
collected garbage), under ticks and then the standby alone, idle. Bounds compressed to seconds
(`Timing`, version_grace 15 times shorter than the default), so the half minute of ticks here
stands for several minutes of the defaults; `--bounds-seconds 1800` ticks for 30 minutes,
which stands for hours."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sinkkit import SHORT_BOUNDS, Service, Sink, Upstream, converged, start, wait_until

from mvsink.io.config import S3Settings

pytestmark = pytest.mark.integration
#: `SHORT_BOUNDS`, and a reader lease renewed every 2 s when idle.
BOUNDS = {**SHORT_BOUNDS, "MVSINK_SHARD_READER_LEASE": "6"}
#: The least time between two ticks, in seconds.
PACE = 1.0
#: Seconds of ticks in `./run test`: five `version_grace`s (`--bounds-seconds` for a soak).
BUDGET_SECONDS = 30.0


def retained(sink: Sink) -> int:
    """How many state versions the shard's log holds now (as `mvsink shard show` counts)."""
    return len(sink.shard.retained_seqnos())


def test_a_standby_and_a_sink_without_compaction_keep_the_state_log_flat(
    kafka_bootstrap: str,
    s3_settings: S3Settings,
    tmp_path: Path,
    procs: list[Service],
    request: pytest.FixtureRequest,
) -> None:
    seconds = request.config.getoption("--bounds-seconds") or BUDGET_SECONDS
    writing = Sink.create(kafka_bootstrap, s3_settings, tmp_path / "writing")
    standby = writing.replica(tmp_path / "standby")
    off = {**BOUNDS, "MVSINK_SHARD_COMPACTION": "false"}
    services = [start(procs, writing, name, **off) for name in ("mint", "write", "append")]
    start(procs, standby, "write", "-standby", **BOUNDS, MVSINK_READ_ONLY="true")
    upstreams = [Upstream(writing), Upstream(standby)]
    samples: list[int] = []
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        # One tick a second at most, so the ticking lasts several `version_grace`s whatever
        # the machine's speed: a faster one would otherwise end before anything is collectable.
        paced = time.monotonic() + PACE
        for upstream in upstreams:
            upstream.tick()
        wait_until(lambda: converged(writing, upstreams[0]), 120, "convergence")
        samples.append(retained(writing))
        if len(samples) % 300 == 0:
            print(f"{time.monotonic() - started:.0f}s: retained {samples[-300:]}", flush=True)
        time.sleep(max(0.0, paced - time.monotonic()))
    written = writing.shard.state().seqno + 1
    print(f"ticking {seconds:.0f}s: {written} versions written, retained after each tick {samples}")
    # Without a collector every version written stays; here the log holds about what
    # `version_grace` of ticks writes (more on a busy machine, where the collector's idle
    # thread lags), and stops growing with the ticks.
    third = len(samples) // 3
    assert written - samples[-1] >= 15, (samples, written)
    assert max(samples[2 * third :]) <= max(samples[third : 2 * third]) + 8, samples

    for service in services:
        assert service.stop() == 0
    # The standby alone and idle: its lease renewed every third of the lease (2 s), not every
    # second, and what it writes pruned by its own collector, which on a shard that stopped
    # changing runs every `IDLE_INTERVAL` (10 s): the last samples come after it ran.
    seqno, before, idle = writing.shard.state().seqno, retained(writing), []
    started = time.monotonic()
    for _ in range(10):
        time.sleep(2)
        idle.append(retained(writing))
    renewals, elapsed = writing.shard.state().seqno - seqno, time.monotonic() - started
    print(f"standby alone {elapsed:.0f}s: {renewals} versions written, retained {before} {idle}")
    assert 2 <= renewals <= elapsed / 2 + 2, renewals
    assert max(idle[-3:]) <= before + 2, (before, idle)
