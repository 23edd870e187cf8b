"""Frontier semantics: Timely's `PartialOrder` on antichains of totally ordered `u64` times."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mvsink.core.errors import FrontierError
from mvsink.core.frontier import MAX_TIME, Frontier, advance, meet_all

E = Frontier.empty()
F0, F1, F5 = Frontier.at(0), Frontier.at(1), Frontier.at(5)
ALL = [E, F0, F1, F5, Frontier.at(MAX_TIME)]

frontiers = st.one_of(st.just(E), st.integers(0, MAX_TIME).map(Frontier.at))


def _key(f: Frontier) -> float:
    """Reference model: `{}` is +infinity, `{t}` is t."""
    return float("inf") if f.is_empty else float(f.time)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("a", "b", "less_equal", "less_than"),
    [
        (E, E, True, False),  # the closed frontier equals itself
        (F0, E, True, True),  # every {t} is below {}
        (F5, E, True, True),
        (E, F0, False, False),  # {} is above every {t}
        (E, F5, False, False),
        (F0, F0, True, False),
        (F0, F1, True, True),
        (F1, F0, False, False),
        (F1, F5, True, True),
        (F5, F1, False, False),
    ],
)
def test_partial_order_cases(a: Frontier, b: Frontier, less_equal: bool, less_than: bool) -> None:
    assert a.less_equal(b) is less_equal
    assert a.less_than(b) is less_than


def test_partial_order_exhaustive_matches_reference_model() -> None:
    for a, b in itertools.product(ALL, ALL):
        assert a.less_equal(b) == (_key(a) <= _key(b)), (a, b)
        assert a.less_than(b) == (_key(a) < _key(b)), (a, b)


@given(frontiers, frontiers)
def test_order_is_total_and_antisymmetric(a: Frontier, b: Frontier) -> None:
    assert a.less_equal(b) or b.less_equal(a)
    if a.less_equal(b) and b.less_equal(a):
        assert a == b
    assert not (a.less_than(b) and b.less_than(a))


@given(frontiers, frontiers)
def test_join_and_meet(a: Frontier, b: Frontier) -> None:
    assert _key(a.join(b)) == max(_key(a), _key(b))
    assert _key(a.meet(b)) == min(_key(a), _key(b))


@pytest.mark.parametrize(
    ("current", "new", "expected", "moved"),
    [
        (F0, F1, F1, True),
        (F1, F1, F1, False),  # equal: no move
        (F5, F1, F5, False),  # regression is ignored
        (F5, E, E, True),  # closing is an advance
        (E, F5, E, False),  # nothing advances past closed
        (E, E, E, False),
    ],
)
def test_advance(current: Frontier, new: Frontier, expected: Frontier, moved: bool) -> None:
    result = advance(current, new)
    assert result.frontier == expected
    assert result.moved is moved


@given(st.lists(frontiers, max_size=20))
def test_advance_never_regresses(observations: list[Frontier]) -> None:
    current = Frontier.minimum()
    for observed in observations:
        result = advance(current, observed)
        assert current.less_equal(result.frontier)
        assert result.moved == (result.frontier != current)
        current = result.frontier
    expected = max([Frontier.minimum(), *observations], key=_key)
    assert current == expected


def test_less_equal_time() -> None:
    assert F1.less_equal_time(1) and F1.less_equal_time(7)
    assert not F5.less_equal_time(4)
    assert not E.less_equal_time(0)  # the closed frontier admits no time


@pytest.mark.parametrize("elements", [[], [0], [42]])
def test_wire_round_trip(elements: list[int]) -> None:
    assert Frontier.from_elements(elements).elements() == elements


@pytest.mark.parametrize(
    ("elements", "message"),
    [([1, 2], "at most one"), ([-1], "outside"), ([MAX_TIME + 1], "outside"), ([True], "int")],
)
def test_invalid_frontiers_are_rejected(elements: list[int], message: str) -> None:
    with pytest.raises(FrontierError, match=message):
        Frontier.from_elements(elements)


def test_meet_all() -> None:
    assert meet_all([F5, F1, E]) == F1
    assert meet_all([E, E]) == E
    assert meet_all([]) == E  # no partitions constrain nothing


def test_str() -> None:
    assert str(E) == "{}" and str(F5) == "{5}" and repr(F5) == "Frontier([5])"
