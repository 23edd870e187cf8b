"""The write task's collector of superseded checkpoints
(`services.write.checkpoint.GatheringCollector`, one per `Checkpoints` handle, so per bucket):
keys queued close together go in one delete, `settle` sends what is queued at once, and a failed
delete loses the thread nothing. The deletes land on a recording blob; the same collector
against MinIO is `tests/integration/test_write_checkpoints.py`'s."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator

import pytest

from services.write import checkpoint


class _Recorder:
    """Stands in for a bucket's `Blob`: records each `remove` as one request."""

    calls: list[tuple[str, list[str]]]
    fail_next: bool

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket

    def remove(self, keys: Iterable[str]) -> None:
        with _LOCK:
            if _Recorder.fail_next:
                _Recorder.fail_next = False
                raise OSError("connection refused")
            _Recorder.calls.append((self.bucket, list(keys)))


_LOCK = threading.Lock()


Collector = checkpoint.GatheringCollector


def _collector(bucket: str) -> Collector:
    return checkpoint.GatheringCollector(_Recorder(bucket))  # type: ignore[arg-type]


@pytest.fixture
def collector() -> Iterator[Collector]:
    _Recorder.calls, _Recorder.fail_next = [], False
    yield _collector("one")


def test_keys_queued_together_go_in_one_delete_per_bucket(collector: Collector) -> None:
    other = _collector("two")  # another bucket's handle: a collector of its own
    collector.GATHER = other.GATHER = 30.0  # nothing is sent before settle
    for version in range(5):
        collector.collect([f"p0/{version}.arrow"])
        other.collect([f"p1/{version}.arrow"])
    time.sleep(0.2)
    assert _Recorder.calls == []  # still gathering
    collector.settle()
    other.settle()
    assert sorted(_Recorder.calls) == [
        ("one", [f"p0/{v}.arrow" for v in range(5)]),
        ("two", [f"p1/{v}.arrow" for v in range(5)]),
    ]


def test_settle_sends_at_once_and_the_collector_goes_on(collector: Collector) -> None:
    collector.GATHER = 30.0
    collector.collect(["a"])
    started = time.monotonic()
    collector.settle()
    assert time.monotonic() - started < 10.0  # not the 30 s gathering window
    assert _Recorder.calls == [("one", ["a"])]
    collector.collect(["b"])  # the same thread gathers again after a settle
    collector.settle()
    assert _Recorder.calls == [("one", ["a"]), ("one", ["b"])]
    collector.settle()  # nothing queued: returns


def test_keys_further_apart_than_the_window_go_separately(collector: Collector) -> None:
    collector.GATHER = 0.05
    collector.collect(["a"])
    deadline = time.monotonic() + 10
    while not _Recorder.calls and time.monotonic() < deadline:  # sent without a settle
        time.sleep(0.01)
    collector.collect(["b"])
    collector.settle()
    assert _Recorder.calls == [("one", ["a"]), ("one", ["b"])]


def test_a_failed_delete_is_logged_and_the_next_is_sent(
    collector: Collector, caplog: pytest.LogCaptureFixture
) -> None:
    collector.GATHER = 0.0
    _Recorder.fail_next = True
    collector.collect(["a"])
    collector.settle()
    assert "deleting superseded checkpoints ['a'] failed" in caplog.text
    collector.collect(["b"])
    collector.settle()
    assert _Recorder.calls == [("one", ["b"])]
