"""`HostState`: which sinks a host serves (mvsink.core.hosting's invariants)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_codec import definition as valid_definition

from mvsink.core.hosting import (
    ALTERED,
    DELETED,
    DROPPED,
    NOT_READY,
    HostState,
    Start,
    Stop,
)
from mvsink.core.messages import SinkDefinition


def definition(
    sink: str, partitions: int = 2, dropped: bool = False, at_ms: int = 1
) -> SinkDefinition:
    return valid_definition(
        sink_id=sink, shard_id=sink, partitions=partitions, dropped=dropped, at_ms=at_ms
    )


def ready_host(*definitions: SinkDefinition) -> HostState:
    state = HostState()
    for d in definitions:
        state.absorb_definition(d.sink_id, d)
    state.absorb_ready(True)
    return state


def test_nothing_is_served_before_the_topic_is_read_to_its_end() -> None:
    state = HostState()
    state.absorb_definition("a", definition("a"))
    assert state.maybe_act() == []
    state.absorb_ready(True)
    assert state.maybe_act() == [Start(definition("a"))]
    assert state.maybe_act() == []  # invariant 2: one unit


@pytest.mark.parametrize(
    ("latest", "why"),
    [
        (None, DELETED),
        (definition("a", dropped=True), DROPPED),
        (definition("a", partitions=3), ALTERED),
    ],
)
def test_a_served_sink_deleted_dropped_or_altered_is_stopped(
    latest: SinkDefinition | None, why: str
) -> None:
    state = ready_host(definition("a"), definition("b"))
    assert len(state.maybe_act()) == 2
    state.absorb_definition("a", latest)
    assert state.maybe_act() == [Stop("a", why)]
    state.absorb_stopped("a")
    # altered: served again with the new settings; dropped or deleted: not again
    assert state.maybe_act() == ([Start(latest)] if why == ALTERED else [])


def test_the_same_settings_written_again_change_nothing() -> None:
    state = ready_host(definition("a"))
    state.maybe_act()
    state.absorb_definition("a", definition("a", at_ms=99))
    assert state.maybe_act() == []


def test_a_unit_that_ended_on_its_own_starts_again_only_for_a_new_definition_or_owner() -> None:
    state = ready_host(definition("a"))
    state.maybe_act()
    state.absorb_ended("a")
    assert state.maybe_act() == []
    state.absorb_definition("a", definition("a", at_ms=5))  # same settings: not again
    assert state.maybe_act() == []
    state.absorb_definition("a", definition("a", partitions=4))
    assert state.maybe_act() == [Start(definition("a", partitions=4))]
    state.absorb_ended("a")
    state.absorb_ready(False)
    state.absorb_ready(True)  # the topic is this host's again
    assert state.maybe_act() == [Start(definition("a", partitions=4))]


def test_losing_the_topic_stops_every_unit() -> None:
    state = ready_host(definition("a"), definition("b"))
    state.maybe_act()
    state.absorb_ready(False)
    assert state.maybe_act() == [Stop("a", NOT_READY), Stop("b", NOT_READY)]


def test_a_dropped_sink_defined_again_is_served_again() -> None:
    state = ready_host(definition("a", dropped=True))
    assert state.maybe_act() == []
    state.absorb_definition("a", definition("a"))
    assert state.maybe_act() == [Start(definition("a"))]


events = st.lists(
    st.one_of(
        st.tuples(
            st.just("define"),
            st.sampled_from("abc"),
            st.one_of(st.none(), st.integers(1, 3)),
            st.booleans(),
        ),
        st.tuples(st.just("ready"), st.booleans()),
        st.tuples(st.just("end"), st.sampled_from("abc"), st.booleans()),
        st.tuples(st.just("act")),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(events)
def test_interleavings_keep_one_unit_per_sink_serving_only_live_definitions(
    script: list[tuple[object, ...]],
) -> None:
    """Any interleaving of definitions, ownership and units ending: at most one unit per sink
    (a start only for a sink not served), units start only when ready and never for a dropped
    sink, and once the shell settles, exactly the live definitions are served."""
    state = HostState()
    running: dict[str, SinkDefinition] = {}
    stopping: set[str] = set()
    for event in script:
        match event:
            case ("define", sink, None, _):
                state.absorb_definition(str(sink), None)
            case ("define", sink, partitions, dropped):
                d = definition(str(sink), int(partitions), bool(dropped))  # type: ignore[call-overload]
                state.absorb_definition(str(sink), d)
            case ("ready", ready):
                state.absorb_ready(bool(ready))
            case ("end", sink, asked):
                if sink in running and (asked or sink not in stopping):
                    del running[sink]
                    if sink in stopping:
                        stopping.discard(sink)
                        state.absorb_stopped(sink)
                    else:
                        state.absorb_ended(sink)
            case ("act",):
                for command in state.maybe_act():
                    match command:
                        case Start(definition=d):
                            assert state.ready and not d.dropped
                            assert d.sink_id not in running  # invariant 2
                            running[d.sink_id] = d
                        case Stop(sink=sink):
                            assert sink in running
                            stopping.add(sink)
    # settle: every stopped unit ends, the host is ready, nothing ended on its own
    state.absorb_ready(False)
    state.absorb_ready(True)
    for _ in range(2):
        for command in state.maybe_act():
            match command:
                case Start(definition=d):
                    running[d.sink_id] = d
                case Stop(sink=sink):
                    del running[sink]
                    state.absorb_stopped(sink)
    live = {s: replace(d, at_ms=0) for s, d in state.defined.items() if not d.dropped}
    assert {s: replace(d, at_ms=0) for s, d in running.items()} == live
