"""`Stopping.every`: a periodic check runs on its own thread until the stop, once per name
however often a body that starts again asks, and `set(why)` keeps the reason."""

from __future__ import annotations

import threading
import time

from mvsink.io.service import Stopping


def test_a_periodic_check_runs_once_per_name_until_the_stop_and_the_stop_keeps_its_reason() -> None:
    stopping = Stopping()
    runs: list[str] = []
    third = threading.Event()

    def check() -> None:
        runs.append(threading.current_thread().name)
        if len(runs) == 3:
            stopping.set("the sink was dropped")
            third.set()

    for _ in range(3):  # a body started three times asks three times
        stopping.every("sink-drop", 0.05, check)
    assert [t.name for t in threading.enumerate()].count("sink-drop") == 1
    assert third.wait(5)
    time.sleep(0.1)
    assert runs == ["sink-drop"] * 3  # one thread, and none after the stop
    assert stopping.stopped and stopping.why == "the sink was dropped"
    stopping.set()  # a signal's stop keeps the earlier reason
    assert stopping.why == "the sink was dropped"
