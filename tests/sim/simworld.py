"""A deterministic world for the shard protocol: an in-memory object store with S3's semantics,
a virtual clock, and a scheduler that runs actors one store call at a time.

Each actor is real mvsink code (`Shard`, the write fold, compaction, GC) on a thread of its own,
but only the actor holding the baton runs: every store call and every sleep hands the baton
back to the scheduler, which picks the next actor with the world's seeded random generator. A
run is therefore a pure function of its seed, whatever the threads' real timing.

Faults, injected at store calls by the same generator (`Faults`):

* a pause: the call freezes for up to `pause` seconds of virtual time before it reaches the
  store, or after it was applied and before its caller sees the reply (a GC pause, a swapped
  out process, an SDK stuck in retries);
* a slow call: the same, for up to `slow` seconds;
* a lost reply: the call was applied, the caller sees a timeout (`IndefiniteWrite` for a
  conditional create, `OSError` for the others, reads too);
* a late create: the caller sees `IndefiniteWrite` before its create reached the store, which
  applies it up to `pause` seconds later (or finds the key taken);
* a LIST that is not a snapshot: it reads the keys below a random point, then, after other
  actors ran, the keys from there on;
* a crash: the actor dies at a call and starts again with a fresh handle (nothing cached);
* clock skew: each actor's wall clock is off by up to `skew` seconds.
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from mvsink.io.s3 import ConditionalResult, IndefiniteWrite, PreconditionFailed, Written
from mvsink.shard.blob import Listed

START = 1_800_000_000.0


class Crash(BaseException):
    """The actor's process dies here (not an `Exception`: no handler of the code catches it)."""


class Stop(BaseException):
    """The run is over: the actor unwinds."""


@dataclass(frozen=True)
class Faults:
    """Per-call probabilities and sizes of the injected faults (module docs)."""

    pause_p: float = 0.0
    pause: float = 0.0
    slow_p: float = 0.0
    slow: float = 0.0
    lost_p: float = 0.0
    crash_p: float = 0.0
    skew: float = 0.0


@dataclass
class Stored:
    data: bytes
    etag: str
    modified: float


@dataclass
class Actor:
    name: str
    body: Callable[[Actor], None]
    world: World
    skew: float = 0.0
    wake_at: float = 0.0
    done: bool = False
    error: BaseException | None = None
    turn: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    restarts: int = 0

    # -- the actor's clock (mvsink.shard.blob.Clock) ------------------------------------------

    def time(self) -> float:
        return self.world.now + self.skew

    def monotonic(self) -> float:
        return self.world.now

    def sleep(self, seconds: float) -> None:
        self.world.yield_point(self, delay=max(seconds, 0.0), faults=False)


class World:
    """The store, the clock and the scheduler of one seeded run."""

    def __init__(self, seed: int, faults: Faults = Faults()) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.faults = faults
        self.now = START
        self.objects: dict[str, Stored] = {}
        #: Every key ever written by a create or put, in order (a key twice: written again).
        self.writes: list[str] = []
        self.actors: list[Actor] = []
        self.steps = 0
        self.running = False
        self.stopping = False
        self.back = threading.Event()
        self.trace: list[str] = []
        self.checks: list[Callable[[], None]] = []
        #: Errors after which an actor starts over with a fresh handle, as a service retries
        #: (a lost reply's error, an indefinite outcome); any other error fails the run.
        self.transient: tuple[type[BaseException], ...] = (Crash, OSError)
        self._local = threading.local()
        #: Creates in flight: when each lands, and how it is applied.
        self.inflight: list[tuple[float, Callable[[], object]]] = []

    # -- actors and the scheduler ---------------------------------------------------------------

    def spawn(self, name: str, body: Callable[[Actor], None]) -> Actor:
        """A new actor; one spawned by another while the world runs (a thread that process
        starts) runs from the next step on."""
        actor = Actor(name, body, self, skew=self.rng.uniform(-1, 1) * self.faults.skew)
        self.actors.append(actor)
        if self.running:
            self._start(actor)
        return actor

    def _start(self, actor: Actor) -> None:
        actor.thread = threading.Thread(target=self._run_actor, args=(actor,), daemon=True)
        actor.thread.start()

    def _run_actor(self, actor: Actor) -> None:
        self._local.actor = actor
        actor.turn.wait()
        actor.turn.clear()
        try:
            while True:
                try:
                    actor.body(actor)
                    break
                except self.transient as error:
                    actor.restarts += 1
                    what = "crashed" if isinstance(error, Crash) else f"starts over: {error!r}"
                    self.trace.append(f"{self.now - START:.3f} {actor.name} {what}")
        except Stop:
            pass
        except BaseException as error:  # a bug the run reports
            actor.error = error
        finally:
            actor.done = True
            self.back.set()

    def run(self, steps: int, until: float = float("inf")) -> None:
        """Run the actors for `steps` store calls or until virtual time `until`, then stop
        them; raises the first error an actor or a check raised."""
        for actor in self.actors:
            self._start(actor)
        self.running = True
        try:
            while self.steps < steps and self.now - START < until:
                self._land()
                live = [a for a in self.actors if not a.done]
                if not live:
                    break
                ready = [a for a in live if a.wake_at <= self.now]
                if not ready:
                    self.now = min([a.wake_at for a in live] + [t for t, _ in self.inflight])
                    continue
                self._give(self.rng.choice(ready))
                self.steps += 1
                for check in self.checks:
                    check()
                failed = next((a for a in self.actors if a.error is not None), None)
                if failed is not None:
                    raise failed.error  # type: ignore[misc]
        finally:
            self.stopping = True
            for actor in self.actors:
                while not actor.done:
                    self._give(actor)

    def _land(self) -> None:
        """Apply the creates in flight whose time has come, in order."""
        due = sorted((t, n) for n, (t, _) in enumerate(self.inflight) if t <= self.now)
        for _, n in due:
            self.inflight[n][1]()
        self.inflight = [entry for entry in self.inflight if entry[0] > self.now]

    def _give(self, actor: Actor) -> None:
        self.back.clear()
        actor.turn.set()
        self.back.wait()

    def yield_point(self, actor: Actor, delay: float = 0.0, faults: bool = True) -> None:
        """Hand the baton back; run again once picked, `delay` (plus any injected pause) of
        virtual time from now."""
        if faults and not self.stopping:
            delay += self._pause()
        actor.wake_at = self.now + delay
        self.back.set()
        actor.turn.wait()
        actor.turn.clear()
        if self.stopping:
            raise Stop
        if faults and self.rng.random() < self.faults.crash_p:
            raise Crash

    def _pause(self) -> float:
        roll = self.rng.random()
        if roll < self.faults.pause_p:
            return self.rng.uniform(0, self.faults.pause)
        if roll < self.faults.pause_p + self.faults.slow_p:
            return self.rng.uniform(0, self.faults.slow)
        return 0.0

    def _call(self, apply: Callable[[], object], lost: Exception | None = None) -> object:
        """One store call from the current actor: a yield (a pause before the call reaches the
        store), the call applied atomically, a yield (a pause before the reply), the reply or,
        if lost, `lost`."""
        actor: Actor | None = getattr(self._local, "actor", None)
        if actor is None:  # the checker, between steps: no yields, no faults
            return apply()
        self.yield_point(actor)
        result = apply()
        is_lost = lost is not None and self.rng.random() < self.faults.lost_p
        self.yield_point(actor)
        if is_lost:
            assert lost is not None
            raise lost
        return result

    def note(self, line: str) -> None:
        self.trace.append(f"{self.now - START:.3f} {line}")


class SimBlob:
    """`mvsink.shard.blob.Blob` on the world's in-memory store."""

    def __init__(self, world: World) -> None:
        self.world = world

    def get(self, key: str, *, last: int = 0) -> tuple[bytes, str] | None:
        def apply() -> tuple[bytes, str] | None:
            found = self.world.objects.get(key)
            if found is None:
                return None
            return (found.data[-last:] if last else found.data), found.etag

        return self.world._call(apply, OSError(f"GET {key}: reply lost"))  # type: ignore[return-value]

    def stat(self, key: str) -> str | None:
        def apply() -> str | None:
            found = self.world.objects.get(key)
            return None if found is None else found.etag

        return self.world._call(apply, OSError(f"HEAD {key}: reply lost"))  # type: ignore[return-value]

    def create(self, key: str, data: bytes, timeout: float | None = None) -> ConditionalResult:
        def apply() -> ConditionalResult:
            found = self.world.objects.get(key)
            if found is not None:  # settled by content, as mvsink.io.s3.conditional_put does
                return Written(found.etag) if found.data == data else PreconditionFailed(found.etag)
            return Written(self._write(key, data))

        world = self.world
        late = world.rng.random() < world.faults.lost_p / 2
        if late and getattr(world._local, "actor", None) is not None:
            world.inflight.append((world.now + world.rng.uniform(0, world.faults.pause), apply))
            world.note(f"PUT {key} in flight")
            world.yield_point(world._local.actor)
            raise IndefiniteWrite(f"PUT {key}: timed out before it landed")
        lost = IndefiniteWrite(f"PUT {key}: reply lost")
        return world._call(apply, lost)  # type: ignore[return-value]

    def head(self, key: str, length: int) -> bytes | None:
        """The first `length` bytes of `key` (a ranged GET), None if missing."""
        found = self.get(key)
        return None if found is None else found[0][:length]

    def put(self, key: str, data: bytes, content_type: str) -> str:
        return self.world._call(lambda: self._write(key, data), OSError(f"PUT {key}: reply lost"))  # type: ignore[return-value]

    def _write(self, key: str, data: bytes) -> str:
        etag = hashlib.md5(data).hexdigest()
        self.world.objects[key] = Stored(data, etag, self.world.now)
        self.world.writes.append(key)
        return etag

    def list(self, prefix: str, *, start_after: str = "", recursive: bool = False) -> list[Listed]:
        world = self.world

        def matching(low: str, high: str | None) -> list[Listed]:
            return [
                Listed(k, o.etag, o.modified, len(o.data))
                for k, o in sorted(world.objects.items())
                if k.startswith(prefix) and k > low and (high is None or k <= high)
            ]

        if getattr(world._local, "actor", None) is None:
            return matching(start_after, None)
        # Not a snapshot: the keys up to a random point now, the rest after others ran.
        keys = [x.key for x in matching(start_after, None)]
        pivot = world.rng.choice(keys) if keys else None
        first = world._call(lambda: matching(start_after, pivot))
        rest = world._call(
            lambda: matching(pivot or start_after, None), OSError(f"LIST {prefix}: reply lost")
        )
        return [*first, *rest] if pivot is not None else rest  # type: ignore[misc]

    def remove(self, keys: Iterable[str]) -> None:
        for key in list(keys):  # one after the other: a pause may fall between two
            self.world._call(
                lambda key=key: self.world.objects.pop(key, None),
                OSError(f"DELETE {key}: reply lost"),
            )


# -- running seeds ------------------------------------------------------------------------------


def run_seed(world: World, run: Callable[[], None], replay: str, tail: int = 15) -> None:
    """`run` a seeded simulation of `world`; a failure names the seed, the store calls it took,
    the one line that replays it and the last `tail` events."""
    try:
        run()
    except BaseException as error:
        events = "\n".join(world.trace[-tail:])
        raise AssertionError(
            f"seed {world.seed} failed after {world.steps} store calls: {error!r}\n"
            f"replay: {replay}\nlast events:\n{events}"
        ) from error


def sweep(
    options: Callable[[str], Any], budget_seeds: int, budget_steps: int
) -> tuple[list[int], int]:
    """The seeds a sweep runs and the store calls per seed, from the `tests/sim` options
    (`--sim-seed`, `--sim-first`, `--sim-seeds`, `--sim-steps`; the budget by default)."""
    steps = options("--sim-steps") or budget_steps
    if options("--sim-seed") is not None:
        return [options("--sim-seed")], steps
    first = options("--sim-first")
    return list(range(first, first + (options("--sim-seeds") or budget_seeds))), steps
