"""The project's own exceptions.

Expected outcomes (a lost compare-and-append race, an outdated description) are values, not
exceptions. These are for broken contracts: bad input, bad configuration, a component that
cannot start. Messages name what is wrong and where.
"""

from __future__ import annotations


class MvsinkError(Exception):
    """Base of every mvsink error."""


class FrontierError(MvsinkError, ValueError):
    """A frontier that is not an antichain of non-negative `u64` times."""


class ContractError(MvsinkError, ValueError):
    """A message that violates its contract (e.g. `lower >= upper`)."""


class DecodeError(MvsinkError):
    """Bytes on a topic that cannot be decoded into one of our records.

    Carries where the bytes came from so they can be quarantined and found again.
    """

    def __init__(
        self,
        reason: str,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.reason = reason
        self.topic = topic
        self.partition = partition
        self.offset = offset
        super().__init__(self._message())

    def located(self, topic: str, partition: int, offset: int) -> DecodeError:
        """The same error, with its Kafka position filled in."""
        return DecodeError(self.reason, topic=topic, partition=partition, offset=offset)

    def _message(self) -> str:
        where = f"topic={self.topic} partition={self.partition} offset={self.offset}"
        return f"cannot decode record at {where}: {self.reason}"


class InvalidUsage(MvsinkError, ValueError):
    """A call that can never succeed as made (persist's `InvalidUsage`): bad bounds, parts staged
    for other bounds, a part appended twice, updates outside their batch."""


class ConfigError(MvsinkError, ValueError):
    """Invalid or incomplete configuration."""


class StackError(MvsinkError, RuntimeError):
    """An embedded-stack component could not be built, started or reached."""


class DesiredGone(MvsinkError):
    """A write task would have to read a desired partition from an offset the broker has
    deleted (below the partition's log start): folding what is left would retract rows whose
    insertions it cannot see, so it folds nothing. Carries what an operator needs."""

    def __init__(
        self, sink_id: str, topic: str, partition: int, needed: int, log_start: int, why: str
    ) -> None:
        self.sink_id, self.topic, self.partition = sink_id, topic, partition
        self.needed, self.log_start, self.why = needed, log_start, why
        super().__init__(
            f"sink {sink_id}: desired partition {topic}[{partition}] must be read from offset "
            f"{needed} ({why}), but the broker deleted everything below offset {log_start}: "
            f"nothing is staged or written for it. Restore the partition's checkpoints, or run "
            f"`mvsink repair {sink_id}` to re-seed them from the shard's contents at its upper "
            f"(trusting the shard), then the write service continues by itself"
        )
