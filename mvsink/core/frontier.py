"""Frontiers: antichains of `u64` times, with Timely's `PartialOrder` semantics.

Our times are totally ordered non-negative integers, so an antichain holds at most one
element: `{t}` means "times `>= t` may still change", and the empty antichain `{}` means the
collection is closed (no more updates, ever). The empty frontier is greater than every `{t}`.

The comparisons are the ones the seed relies on (`timely::PartialOrder` on `Antichain`):

* `less_equal(a, b)`: every element of `b` is `>=` some element of `a`. So `{}` is
  `less_equal` only to `{}`, and every frontier is `less_equal` to `{}`.
* `less_than(a, b)`: `less_equal(a, b)` and `a != b`.

Wire form (Avro `array<long>`): `[]` or `[t]`; anything else is rejected with `FrontierError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from mvsink.core.errors import FrontierError

#: Largest time we accept: a `u64` that also fits Avro `long` (signed 64-bit) on the wire.
MAX_TIME = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Frontier:
    """An antichain of totally ordered times: `{t}` or the empty (closed) frontier `{}`.

    Construct with `Frontier.at(t)`, `Frontier.empty()`, `Frontier.minimum()` or
    `Frontier.from_elements(...)`. Instances are immutable and hashable.
    """

    #: The frontier's single element, or `None` for the empty frontier.
    time: int | None

    def __post_init__(self) -> None:
        if self.time is None:
            return
        if isinstance(self.time, bool) or not isinstance(self.time, int):
            raise FrontierError(f"frontier time must be an int, got {self.time!r}")
        if not 0 <= self.time <= MAX_TIME:
            raise FrontierError(f"frontier time {self.time} outside [0, {MAX_TIME}]")

    # -- constructors -------------------------------------------------------------------------

    @classmethod
    def at(cls, time: int) -> Frontier:
        """The frontier `{time}`."""
        return cls(time)

    @classmethod
    def empty(cls) -> Frontier:
        """The empty frontier `{}`: closed, greater than every `{t}`."""
        return cls(None)

    @classmethod
    def minimum(cls) -> Frontier:
        """The frontier `{0}` (`Timestamp::MIN`): nothing is final yet."""
        return cls(0)

    @classmethod
    def from_elements(cls, elements: Iterable[int]) -> Frontier:
        """Build from antichain elements (the wire form): `[]` or `[t]`.

        Raises:
            FrontierError: more than one element (not an antichain of a total order) or a bad time.
        """
        items = list(elements)
        if len(items) > 1:
            raise FrontierError(
                f"frontier {items!r} has {len(items)} elements; an antichain of totally "
                "ordered times has at most one"
            )
        return cls(items[0] if items else None)

    # -- accessors ----------------------------------------------------------------------------

    @property
    def is_empty(self) -> bool:
        """Whether this is the closed frontier `{}`."""
        return self.time is None

    def elements(self) -> list[int]:
        """The antichain's elements, i.e. the wire form."""
        return [] if self.time is None else [self.time]

    def as_option(self) -> int | None:
        """The single element, or `None` if empty (the seed's `as_option`)."""
        return self.time

    # -- order --------------------------------------------------------------------------------

    def less_equal(self, other: Frontier) -> bool:
        """`PartialOrder::less_equal`: every element of `other` is `>=` an element of `self`."""
        if other.time is None:
            return True
        if self.time is None:
            return False
        return self.time <= other.time

    def less_than(self, other: Frontier) -> bool:
        """`PartialOrder::less_than`: `less_equal` and not equal."""
        return self != other and self.less_equal(other)

    def less_equal_time(self, time: int) -> bool:
        """Whether `time` is not yet final under this frontier (`self.less_equal(&time)`)."""
        return self.time is not None and self.time <= time

    def join(self, other: Frontier) -> Frontier:
        """The larger of two frontiers (least upper bound)."""
        return other if self.less_equal(other) else self

    def meet(self, other: Frontier) -> Frontier:
        """The smaller of two frontiers (greatest lower bound)."""
        return self if self.less_equal(other) else other

    def __repr__(self) -> str:
        return f"Frontier({self.elements()})"

    def __str__(self) -> str:
        return "{" + ("" if self.time is None else str(self.time)) + "}"


class Advanced(NamedTuple):
    """Result of `advance`: the resulting frontier and whether it moved."""

    frontier: Frontier
    moved: bool


def advance(frontier: Frontier, new: Frontier) -> Advanced:
    """Advance `frontier` to `new` if `new` is strictly greater (the seed's `advance`).

    A regressing or equal `new` leaves `frontier` as it is, so callers can feed any
    (possibly stale or duplicated) observation without moving backwards.
    """
    if frontier.less_than(new):
        return Advanced(new, True)
    return Advanced(frontier, False)


class TracksPersistFrontier(Protocol):
    """A state machine that keeps the shard's upper as last observed (`persist_frontier`) and
    traces its frontiers (mint's and write's)."""

    persist_frontier: Frontier

    def trace(self, message: str) -> None:
        """Log `message` with every frontier."""


def advance_persist(state: TracksPersistFrontier, frontier: Frontier) -> bool:
    """`state.advance_persist_frontier`: move `state.persist_frontier` to the shard's upper
    `frontier` if that is greater, tracing the move; whether it moved.

    A regressing or repeated upper (a stale `ShardUpper`, a re-read of the shard) leaves it as
    it is, so the persist frontier never regresses.
    """
    result = advance(state.persist_frontier, frontier)
    state.persist_frontier = result.frontier
    if result.moved:
        state.trace("advanced `persist` frontier")
    return result.moved


def meet_all(frontiers: Sequence[Frontier]) -> Frontier:
    """The meet (minimum) of several frontiers; the empty frontier for no inputs."""
    result = Frontier.empty()
    for frontier in frontiers:
        result = result.meet(frontier)
    return result
