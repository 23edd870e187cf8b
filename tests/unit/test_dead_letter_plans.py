"""Where `mvsink dead-letters replay` sends a dead letter back, or why it cannot
(`mvsink.tools.dead_letters.plan_replay`): pure, from the letter's bytes and headers; and the
quarantined offsets a write state keeps for replays (`services.write.fold.newest`)."""

from __future__ import annotations

import pytest

from mvsink.core.codec import encode
from mvsink.core.frontier import Frontier
from mvsink.core.messages import (
    BatchDescription,
    BatchId,
    Part,
    Progress,
    ShardUpper,
    StagedBatch,
)
from mvsink.io.config import Topics
from mvsink.tools.dead_letters import DeadLetter, Send, StillBad, plan_replay
from services.write.fold import newest

TOPICS = Topics.for_sink("s")
COUNTS = {TOPICS.desired: 2, TOPICS.batches: 2, TOPICS.descs: 1}
F = Frontier.at
DESC = BatchDescription("s", BatchId(0, 1), F(1), F(2), 1)
BATCH = StagedBatch(BatchId(0, 1), F(1), F(2), (0,), (Part("k", 0, 2, 1, 10, 2),), "w")


def letter(
    value: bytes | None, key: bytes | None = b"1", source: tuple[str, int] | None = None
) -> DeadLetter:
    headers = [("mvsink-error", b"why")]
    if source is not None:
        headers += [("mvsink-topic", source[0].encode()), ("mvsink-partition", b"%d" % source[1])]
        headers += [("mvsink-offset", b"7")]
    return DeadLetter(3, 0.0, key, value, headers)


@pytest.mark.parametrize(
    ("dead", "expected"),
    [
        (letter(encode(Progress(F(4))), source=(TOPICS.desired, 1)), (TOPICS.desired, 1)),
        (letter(encode(Progress(F(4))), key=b"0"), "no original place"),  # a legacy letter
        (letter(encode(BATCH), key=b"1"), (TOPICS.batches, 1)),  # a legacy one: by its key
        (letter(encode(BATCH), source=(TOPICS.batches, 1)), (TOPICS.batches, 1)),
        (letter(encode(DESC), key=None), (TOPICS.descs, 0)),
        (letter(b"\x00garbage", source=(TOPICS.desired, 0)), "still undecodable"),
        (letter(None), "null value"),
        (letter(encode(ShardUpper("s", F(1), 1))), "ShardUpper is not replayed"),
        (letter(encode(DESC), source=(TOPICS.desired, 0)), f"read from {TOPICS.desired}"),
        (letter(encode(Progress(F(4))), source=(TOPICS.desired, 5)), "has no partition 5"),
        (letter(encode(Progress(F(4))), source=("other.desired", 0)), "read from other"),
    ],
)
def test_a_letter_goes_back_to_the_topic_of_its_kind_or_back_with_why(
    dead: DeadLetter, expected: tuple[str, int] | str
) -> None:
    plan = plan_replay(dead, TOPICS, COUNTS)
    if isinstance(expected, tuple):
        assert plan == Send(dead, *expected)
    else:
        assert isinstance(plan, StillBad) and expected in plan.reason, plan


def test_a_letter_line_says_where_from_and_why() -> None:
    line = letter(b"abc", source=(TOPICS.desired, 1)).line()
    assert line.split("\t") == ["3", "1970-01-01T00:00:00Z", f"{TOPICS.desired}[1]@7", "3B", "why"]
    assert "\t?\t" in letter(b"abc").line()


@pytest.mark.parametrize(
    ("offsets", "kept", "expected"),
    [
        ({3, 1, 2}, 5, {1, 2, 3}),
        ({3, 1, 2}, 3, {1, 2, 3}),
        ({7, 1, 5, 3}, 2, {5, 7}),  # the newest stay: a replay of 1 or 3 is refused
        (set(), 2, set()),
    ],
)
def test_a_state_keeps_the_newest_quarantined_offsets(
    offsets: set[int], kept: int, expected: set[int]
) -> None:
    assert newest(offsets, kept) == expected
