"""`run_task`'s restart when a step finds the shard's `since` past its fold (`SincePassed`):
the half-changed state this worker holds is dropped and the step runs again from its version
and the latest shard state (which rebuilds); a step that never stops finding it fails."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from mvsink.core.errors import MvsinkError
from services.write import checkpoint, task
from services.write.fold import SincePassed

KEY = ("sink", 3)


def test_a_step_that_finds_since_past_its_fold_starts_over(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Any, bool]] = []

    def step(spec: Any, shard_state: Any) -> str:
        seen.append((shard_state, KEY in checkpoint.CACHE))
        checkpoint.CACHE[KEY] = "half a step"  # type: ignore[assignment]
        if len(seen) == 1:
            raise SincePassed("since passed the fold")
        return "result"

    monkeypatch.setattr(task, "_step", step)
    monkeypatch.setattr(checkpoint, "CACHE", {})
    spec = SimpleNamespace(sink_id="sink", partition=3)
    assert task.run_task(spec, "the round's state") == "result"  # type: ignore[arg-type]
    # The first attempt used the round's state; the second the latest, with nothing cached.
    assert seen == [("the round's state", False), (None, False)]


def test_a_step_that_keeps_finding_since_past_its_fold_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def step(spec: Any, shard_state: Any) -> str:
        checkpoint.CACHE[KEY] = "half a step"  # type: ignore[assignment]
        raise SincePassed("since passed the fold")

    monkeypatch.setattr(task, "_step", step)
    monkeypatch.setattr(checkpoint, "CACHE", {})
    with pytest.raises(MvsinkError, match="kept passing"):
        task.run_task(SimpleNamespace(sink_id="sink", partition=3), None)  # type: ignore[arg-type]
    assert KEY not in checkpoint.CACHE
