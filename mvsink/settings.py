"""Settings shared by the configuration (`mvsink.config`) and the libraries it configures
(`mvsink.s3`, `mvsink.shard`): plain validated dataclasses, one floor below both, so neither
imports the other."""

from __future__ import annotations

from dataclasses import dataclass, field

from mvsink.errors import ContractError


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
    """Time bounds that make deletion safe (see the package docs, "Deleting").

    * `max_attempt_age`: a compare-and-append never writes version `n+1` later than this after
      reading version `n`; it starts over instead.
    * `max_part_age`: compare-and-append refuses parts staged longer ago than this.
    * `min_grace`: `sweep` refuses a grace period below this; it must exceed both bounds above.
    """

    max_attempt_age: float = 30.0
    max_part_age: float = 600.0
    min_grace: float = 900.0
    poll_interval: float = 0.05

    def __post_init__(self) -> None:
        if self.min_grace <= self.max_part_age + self.max_attempt_age:
            raise ContractError(
                f"min_grace {self.min_grace}s must exceed max_part_age {self.max_part_age}s "
                f"+ max_attempt_age {self.max_attempt_age}s"
            )
