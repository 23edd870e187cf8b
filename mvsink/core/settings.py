"""Settings shared by the configuration (`mvsink.io.config`) and the libraries it configures
(`mvsink.io.s3`, `mvsink.shard`): plain validated dataclasses, one floor below both, so neither
imports the other."""

from __future__ import annotations

from dataclasses import dataclass, field

from mvsink.core.errors import ContractError

#: Seconds between the write service's folds of the shard's read-back when it has nothing to
#: stage (a read-only or idle driver), keeping its memory bounded; a bench waits one for it.
#: A fold that would see what the last one saw is skipped (`WriteState.fold_view`).
FOLD_INTERVAL = 10.0

#: Seconds between mint's and write's own reads of their shard's upper while they expect it to
#: move (a description outstanding, desired ahead of the shard), and while they do not (idle).
#: The upper's notifications on `frontiers` move them either way; the read is for one lost,
#: so the idle interval only bounds how late a lost notification of a foreign write is seen.
SHARD_POLL, IDLE_SHARD_POLL = 1.0, 30.0


def shard_poll_due(last: float | None, now: float, working: bool) -> bool:
    """Whether a service that last read its shard's upper at `last` (None: never) reads it
    again at `now`: after `SHARD_POLL` while `working`, `IDLE_SHARD_POLL` otherwise (so work
    arriving after a long idle reads it at once)."""
    return last is None or now - last >= (SHARD_POLL if working else IDLE_SHARD_POLL)


@dataclass(frozen=True)
class Secret:
    """A credential: compares and hashes by value, never prints it."""

    value: str = field(repr=False)

    def __repr__(self) -> str:
        return "Secret(****)"

    __str__ = __repr__

    def reveal(self) -> str:
        """The secret itself, for the one call that needs it."""
        return self.value


@dataclass(frozen=True)
class S3Settings:
    """Where the shard lives: any S3 endpoint that honours conditional writes."""

    endpoint: str
    bucket: str
    region: str
    access_key: Secret
    secret_key: Secret
    secure: bool


@dataclass(frozen=True)
class Timing:
    """Time bounds of the shard's garbage collection: when something is worth deleting. Safety
    rests on fences in the state, not on these (`mvsink.shard`, docs/design.md §4.4 "Fences"):
    a process that pauses past any of them meets a fence when it resumes.

    * `max_attempt_age`: a compare-and-set never writes version `n+1` later than this after
      reading version `n`; it starts over instead.
    * `max_part_age`: compare-and-append and compare-and-merge refuse parts staged longer ago
      than this.
    * `min_grace`: the sweeper deletes a never-referenced part only when it is older than a grace
      of at least this (and after moving the state's `sweep_horizon` past it); it exceeds both
      bounds above, so a writer that does not pause seldom sees its parts refused.
    * `part_grace`: a part a merge replaced is deleted this long after the merge (readers still
      reading the replaced version finish within it, or start over from the latest one).
    * `version_grace`: a superseded state version is pruned this long after it was superseded;
      it exceeds `max_attempt_age + request_timeout`, so a writer that does not pause seldom
      writes a pruned seqno again (one that does is not trusted: `Shard._create_version`).
    * `reader_lease`: how long a reader's hold on `since` lives without renewal.
    * `request_timeout`: the read timeout of a conditional create (bounds how late one lands).
    """

    max_attempt_age: float = 30.0
    max_part_age: float = 600.0
    min_grace: float = 900.0
    poll_interval: float = 0.05
    part_grace: float = 10.0
    version_grace: float = 90.0
    reader_lease: float = 900.0
    request_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.min_grace <= self.max_part_age + self.max_attempt_age:
            raise ContractError(
                f"min_grace {self.min_grace}s must exceed max_part_age {self.max_part_age}s "
                f"+ max_attempt_age {self.max_attempt_age}s"
            )
        if self.version_grace <= self.max_attempt_age + self.request_timeout:
            raise ContractError(
                f"version_grace {self.version_grace}s must exceed max_attempt_age "
                f"{self.max_attempt_age}s + request_timeout {self.request_timeout}s"
            )
        if not 0 <= self.part_grace <= self.version_grace or self.reader_lease <= 0:
            raise ContractError(
                f"part_grace {self.part_grace}s must be in [0, version_grace "
                f"{self.version_grace}s] (replaced parts go before the versions naming them), "
                f"reader_lease {self.reader_lease}s > 0"
            )


@dataclass(frozen=True)
class CompactionPolicy:
    """When live batches merge (`mvsink.shard.state.maybe_merge`): size-tiered, so live batches
    stay logarithmic in history and bytes within `1 + max_amplification` of the oldest, plus
    the batches `since` has not passed yet.

    * `max_amplification`: merge the batches `since` has passed once the newer of them hold
      this many times the updates of the oldest one;
    * `size_ratio`, `min_merge`: merge a run of at least `min_merge` batches of similar size
      (each older one at most `1 + size_ratio` times the newer run), `since` has passed;
    * `max_batches`: never keep more live batches than this.
    """

    max_amplification: float = 1.0
    size_ratio: float = 1.0
    min_merge: int = 4
    max_batches: int = 16

    def __post_init__(self) -> None:
        if self.max_amplification <= 0 or self.size_ratio < 0:
            raise ContractError("max_amplification must be > 0 and size_ratio >= 0")
        if self.min_merge < 2 or self.max_batches < 2:
            raise ContractError("min_merge and max_batches must be >= 2")
