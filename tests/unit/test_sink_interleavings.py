"""mint and append under random interleavings (Hypothesis): duplicated and redelivered
descriptions and batches, mint and append restarts, concurrent writers moving the shard.

A small world drives the real pure states: a descs log, one batches log per append worker,
write stages that report batches (sometimes twice, sometimes partially), and a model shard with
the seed's append retry. Invariants checked after every step:

* minted lowers strictly increase in `descs`, across mint restarts (mint invariant 1);
* an `Append` covers every desired partition (never append an incomplete description);
* the shard takes at most one append per lower (never append twice for one lower);
* no part is appended twice, and no part an `Append` carries was ever deleted before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import event, given, settings
from hypothesis import strategies as st

from mvsink.core.frontier import Frontier
from mvsink.core.messages import BatchDescription, Part, StagedBatch
from mvsink.shard.state import Appended, UpperMismatch
from services.append.state import (
    Append,
    AppendOutcome,
    AppendState,
    Command,
    DeleteStaged,
)
from services.mint.state import MintState

F = Frontier.at
P, A = 3, 2

ACTIONS = [
    "progress",
    "mint",
    "mint_restart",
    "write",
    "write_dup",
    "deliver_desc",
    "deliver_batch",
    "redeliver",
    "append_restart",
    "foreign",
]


@dataclass
class World:
    desired: list[int] = field(default_factory=lambda: [0] * P)
    shard_upper: int = 0
    shard_parts: set[str] = field(default_factory=set)
    appended_lowers: list[int] = field(default_factory=list)
    deleted: set[str] = field(default_factory=set)
    descs: list[BatchDescription] = field(default_factory=list)
    batches: dict[int, list[StagedBatch]] = field(default_factory=lambda: {w: [] for w in range(A)})
    mint: MintState = field(default_factory=lambda: MintState("s", P, A, F(0), read_only=False))
    workers: dict[int, AppendState] = field(default_factory=dict)
    seen_descs: dict[int, int] = field(default_factory=lambda: dict.fromkeys(range(A), 0))
    seen_batches: dict[int, int] = field(default_factory=lambda: dict.fromkeys(range(A), 0))
    issued: dict[int, set[int]] = field(default_factory=lambda: {w: set() for w in range(A)})
    next_key: int = 0

    def __post_init__(self) -> None:
        for w in range(A):
            self.workers[w] = AppendState("s", w, P)

    # -- the model shard, with the seed's append retry ------------------------------------

    def compare_and_append(self, append: Append) -> AppendOutcome:
        lower, upper = append.desc.lower.time, append.desc.upper.time
        assert lower is not None and upper is not None
        while True:
            if self.shard_upper == lower:
                assert lower not in self.appended_lowers, "appended twice for one lower"
                keys = {p.key for p in append.parts}
                assert not keys & self.shard_parts, "a part appended twice"
                assert not keys & self.deleted, "appended a deleted part"
                self.appended_lowers.append(lower)
                self.shard_parts |= keys
                self.shard_upper = upper
                return Appended(F(upper), len(self.appended_lowers))
            if self.shard_upper < lower:
                self.shard_upper = lower  # advance_upper(lower), then retry
                continue
            return UpperMismatch(F(self.shard_upper), len(self.appended_lowers))

    def execute(self, worker: int, commands: list[Command]) -> None:
        for command in commands:
            match command:
                case Append():
                    assert command.desc.append_worker == worker
                    assert {p.partition for p in command.parts} == set(range(P)), "incomplete"
                    lower = command.desc.lower.time
                    assert lower not in self.issued[worker], "issued twice in one life"
                    self.issued[worker].add(lower)  # type: ignore[arg-type]
                    outcome = self.compare_and_append(command)
                    self.execute(worker, self.workers[worker].absorb_append_outcome(outcome))
                case DeleteStaged():
                    for part in command.parts:  # the shard refuses referenced parts
                        if part.key not in self.shard_parts:
                            self.deleted.add(part.key)

    # -- actions ------------------------------------------------------------------------------

    def step(self, action: str, data: st.DataObject) -> None:
        pick = lambda strategy: data.draw(strategy)  # noqa: E731
        if action == "progress":  # every partition moves by 1..3
            for partition in range(P):
                self.desired[partition] += pick(st.integers(1, 3))
        elif action == "mint":
            for partition, t in enumerate(self.desired):
                self.mint.advance_desired_frontier(partition, F(t))
            self.mint.advance_persist_frontier(F(self.shard_upper))
            desc = self.mint.maybe_mint_batch_description()
            if desc is not None:
                if self.descs:
                    assert self.descs[-1].lower.less_than(desc.lower), "lowers must increase"
                    assert self.descs[-1].upper.less_equal(desc.upper), "uppers monotone"
                self.descs.append(desc)
        elif action == "mint_restart":
            self.mint = MintState("s", P, A, F(0), read_only=False)
            self.mint.restore(self.descs[-1] if self.descs else None)
        elif action in ("write", "write_dup") and self.descs:
            desc = self.descs[-1] if action == "write" else pick(st.sampled_from(self.descs))
            everything = st.just(frozenset(range(P)))
            some = st.frozensets(st.integers(0, P - 1), min_size=1)
            covers = tuple(sorted(pick(st.one_of(everything, some))))
            parts = []
            for partition in covers:
                self.next_key += 1
                parts.append(Part(f"p{self.next_key}", partition, P, 1, 1))
            batch = StagedBatch(desc.id, desc.lower, desc.upper, covers, tuple(parts), "w")
            self.batches[desc.append_worker].append(batch)
        elif action == "deliver_desc":
            w = pick(st.integers(0, A - 1))
            if self.seen_descs[w] < len(self.descs):
                desc = self.descs[self.seen_descs[w]]
                self.seen_descs[w] += 1
                self.execute(w, self.workers[w].absorb_batch_description(desc))
        elif action == "deliver_batch":
            w = pick(st.integers(0, A - 1))
            if self.seen_batches[w] < len(self.batches[w]):
                batch = self.batches[w][self.seen_batches[w]]
                self.seen_batches[w] += 1
                self.execute(w, self.workers[w].absorb_batch(batch))
        elif action == "redeliver":
            w = pick(st.integers(0, A - 1))
            if self.seen_batches[w]:
                batch = pick(st.sampled_from(self.batches[w][: self.seen_batches[w]]))
                self.execute(w, self.workers[w].absorb_batch(batch))
        elif action == "append_restart":  # uncommitted offsets: everything is redelivered
            w = pick(st.integers(0, A - 1))
            self.workers[w] = AppendState("s", w, P)
            self.seen_descs[w] = self.seen_batches[w] = 0
            self.issued[w] = set()
        elif action == "foreign":  # a concurrent replica appends first
            self.shard_upper += 1

    def drain(self) -> None:
        """Deliver everything, so the last description can complete."""
        for w in range(A):
            while self.seen_descs[w] < len(self.descs):
                self.seen_descs[w] += 1
                self.execute(
                    w, self.workers[w].absorb_batch_description(self.descs[self.seen_descs[w] - 1])
                )
            while self.seen_batches[w] < len(self.batches[w]):
                self.seen_batches[w] += 1
                self.execute(
                    w, self.workers[w].absorb_batch(self.batches[w][self.seen_batches[w] - 1])
                )


@settings(max_examples=500, deadline=None)
@given(actions=st.lists(st.sampled_from(ACTIONS), min_size=10, max_size=120), data=st.data())
def test_random_interleavings_keep_the_invariants(actions: list[str], data: st.DataObject) -> None:
    world = World()
    for action in actions:
        world.step(action, data)
    world.drain()
    assert world.appended_lowers == sorted(set(world.appended_lowers))
    event(f"appends: {min(len(world.appended_lowers), 3)}+")
    event(f"descriptions: {min(len(world.descs), 3)}+")


def test_a_quiet_run_makes_progress() -> None:
    """Liveness in the simplest schedule: progress, mint, write everything, deliver: appended."""
    world = World()
    world.desired = [4] * P
    world.step("mint", st.data())  # type: ignore[arg-type]
    desc = world.descs[-1]
    parts = tuple(Part(f"q{p}", p, P, 1, 1) for p in range(P))
    world.batches[desc.append_worker].append(
        StagedBatch(desc.id, desc.lower, desc.upper, tuple(range(P)), parts, "w")
    )
    world.drain()
    assert world.appended_lowers == [0] and world.shard_upper == 4
