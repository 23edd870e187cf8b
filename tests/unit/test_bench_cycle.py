"""`mvsink.bench.cycle`: a description's cycle from the services' log lines."""

from __future__ import annotations

import threading
import time

import pytest

from mvsink.bench.cycle import cycle_phases, describe
from mvsink.bench.steady import first_job


def _line(clock: str, service: str, logger: str, message: str) -> str:
    return f"2026-11-28 {clock} INFO {service} {logger}: {message}"


def _minted(clock: str, n: int) -> str:
    return _line(
        clock, "mint", "mvsink.mint", f"minted desc 0.{n} [{{{n}}}, {{{n + 1}}}) -> append 0"
    )


def _staged(clock: str, n: int, total: float, job: float, stage: float) -> str:
    steps = {"load": 0.0001, "desired": 0.02, "persist": 0.01, "stage": stage, "task": job - 0.01}
    return _line(
        clock,
        "write",
        "mvsink.write",
        f"staged desc 0.{n} [{{{n}}}, {{{n + 1}}}) -> append 0: partitions [0, 1], 2 parts, "
        f"200000 updates in {total:.3f}s (Spark job {job:.3f}s, slowest task's steps: {steps})",
    )


def _appended(clock: str, n: int) -> str:
    return _line(
        clock,
        "append",
        "mvsink.append",
        f"appended 2 parts for desc 0.{n} [{{{n}}}, {{{n + 1}}}) -> append 0 (seqno {n}) in 20.0 ms",
    )


def _epoch(clock: str) -> float:
    return time.mktime(time.strptime(f"2026-11-28 {clock}", "%Y-%m-%d %H:%M:%S"))


MINT = "\n".join(
    [
        _minted("10:00:00,000", 1),
        _minted("10:00:00,300", 2),
        _minted("10:00:00,700", 3),  # lost: never appended (another writer's batch won)
        _minted("10:00:01,000", 4),
        _minted("10:00:01,200", 5),  # the last one: no next description to end its cycle
        "2026-11-28 10:00:01,300 INFO mint mvsink: received SIGTERM: stopping",
    ]
)
WRITE = "\n".join(
    [
        _staged("10:00:00,210", 1, 0.200, 0.190, 0.080),
        _staged("10:00:00,560", 2, 0.250, 0.240, 0.100),
        _staged("10:00:00,900", 3, 0.190, 0.180, 0.070),
        _staged("10:00:01,150", 4, 0.120, 0.100, 0.050),
        _staged("10:00:01,170", 4, 0.010, 0.010, 0.005),  # restaged: the first one counts
        "2026-11-28 10:00:01,180 WARNING write mvsink.write: something else",
    ]
)
APPEND = "\n".join(
    [
        _appended("10:00:00,240", 1),
        _appended("10:00:00,580", 2),
        _appended("10:00:01,180", 4),
    ]
)


def test_the_phases_of_each_description_and_their_medians() -> None:
    whole = (_epoch("10:00:00"), _epoch("10:00:02"))
    cycle = cycle_phases(MINT, WRITE, APPEND, whole)
    # desc 1: minted 0.000, job from 0.010 (staged 0.210 - 0.200), staged 0.210, appended 0.240,
    # next minted 0.300; desc 2: 0.300, 0.310, 0.560, 0.580, 0.700; desc 4: 1.000, 1.030,
    # 1.150, 1.180, 1.200; desc 3 (not appended) and desc 5 (no next) are left out.
    expected = {
        "cycle": [0.3, 0.4, 0.2],
        "to_job": [0.01, 0.01, 0.03],
        "job": [0.19, 0.24, 0.1],
        "report": [0.01, 0.01, 0.02],
        "append": [0.03, 0.02, 0.03],
        "to_next": [0.06, 0.12, 0.02],
        "task.desired": [0.02, 0.02, 0.02],
        "task.stage": [0.08, 0.1, 0.05],
        "task": [0.18, 0.23, 0.09],
    }
    for name, values in expected.items():
        assert cycle[name] == pytest.approx(sorted(values)[1], abs=1e-6), name
    assert "task.checkpoint" not in cycle  # not in these steps
    assert describe(cycle) == (
        "0.300 s a description: to_job 0.010, job 0.190 (slowest task 0.180: desired 0.020 "
        "persist 0.010 stage 0.080), report 0.010, append 0.030, to_next 0.060"
    )


def test_only_descriptions_minted_within_the_window_count() -> None:
    window = (_epoch("10:00:00") + 0.25, _epoch("10:00:00") + 0.9)  # desc 2 (and lost 3)
    cycle = cycle_phases(MINT, WRITE, APPEND, window)
    assert cycle["cycle"] == pytest.approx(0.4) and cycle["job"] == pytest.approx(0.24)
    assert cycle_phases(MINT, WRITE, APPEND, (0.0, 1.0)) == {}
    assert cycle_phases("", "", "", (0.0, 2e9)) == {}


def test_first_job_waits_for_a_line_written_after_the_upper(tmp_path) -> None:
    """The driver logs a staging job after reporting its batch, so a caller that saw the upper
    can read the log before the line is there: `first_job` waits for it, and gives nan when no
    line comes within its wait."""
    log = tmp_path / "write.log"
    log.write_text(_line("09:59:59,000", "write", "mvsink.write", "started") + "\n")
    offset = log.stat().st_size

    def late() -> None:
        time.sleep(0.5)
        with log.open("a") as out:
            out.write(_staged("10:00:00,210", 1, 0.200, 0.190, 0.080) + "\n")

    writer = threading.Thread(target=late)
    writer.start()
    assert first_job(log, offset, wait=10.0) == (0.2, 200000)
    writer.join()
    assert first_job(log, log.stat().st_size, wait=0.3) == (
        pytest.approx(float("nan"), nan_ok=True),
        -1,
    )
