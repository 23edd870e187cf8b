"""`run_task`'s restart when a step finds the shard's `since` past its fold (`SincePassed`):
the half-changed state its worker holds is dropped and the step runs again from its version
and the latest shard state (which rebuilds); a step that never stops finding it fails."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from mvsink.core.errors import MvsinkError
from services.write import task
from services.write.fold import SincePassed
from services.write.task import WriteWorker

KEY = ("sink", 3)
SPEC: Any = SimpleNamespace(sink=SimpleNamespace(sink_id="sink"), partition=3)
#: Stand-ins for a state, a shard state and a result: the restart only passes them on.
STATE: Any = "a state"
ROUND: Any = "the round's state"
RESULT: Any = "result"


def test_a_step_that_finds_since_past_its_fold_starts_over(monkeypatch: pytest.MonkeyPatch) -> None:
    worker = WriteWorker()
    seen: list[tuple[Any, bool]] = []

    def step(spec: Any, in_worker: WriteWorker, shard_state: Any) -> Any:
        assert in_worker is worker
        seen.append((shard_state, KEY in worker.states.states))
        worker.states.states[KEY] = STATE
        if len(seen) == 1:
            raise SincePassed("since passed the fold")
        return RESULT

    monkeypatch.setattr(task, "_step", step)
    assert task.run_task(SPEC, worker, ROUND) == RESULT
    # The first attempt used the round's state; the second the latest, with nothing cached.
    assert seen == [(ROUND, False), (None, False)]


def test_a_step_that_keeps_finding_since_past_its_fold_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker = WriteWorker()

    def step(spec: Any, in_worker: WriteWorker, shard_state: Any) -> Any:
        worker.states.states[KEY] = STATE
        raise SincePassed("since passed the fold")

    monkeypatch.setattr(task, "_step", step)
    with pytest.raises(MvsinkError, match="kept passing"):
        task.run_task(SPEC, worker, None)
    assert KEY not in worker.states.states


def test_a_resident_worker_shares_the_states_but_not_the_policy() -> None:
    """Rule 1 of `services.write.resident`: a resident's worker holds the states its Python
    worker's one-shot tasks hold (and the reverse), defers warm copies and keeps readers,
    while the one-shot tasks' worker writes warm copies at every save and keeps no reader."""
    worker = WriteWorker()
    resident = worker.resident()
    resident.states.states[KEY] = STATE
    assert worker.states.states[KEY] is STATE
    assert (resident.states.warm_copies, resident.readers.keep) == (False, True)
    assert (worker.states.warm_copies, worker.readers.keep) == (True, False)
    assert resident.shards is worker.shards
    resident.leave()  # nothing deferred, no reader kept: nothing to do
    assert worker.states.states[KEY] is STATE


def test_the_process_worker_is_one_per_process() -> None:
    """A one-shot task's steps share their Python worker's states (`task.one_shot`)."""
    assert task.PROCESS.worker() is task.PROCESS.worker()
    assert task.ProcessWorker().worker() is not task.PROCESS.worker()  # an explicit handle
