"""A read that keeps what it reads: a reader lease at `as_of` that also pins the version the
reader takes its parts from (persist's leased reader with its seqno hold), for reads that take
longer than `Timing.part_grace`, e.g. a Spark job over many parts (`mvsink.shard.spark`).

`PinnedRead(shard, reader_id, as_of)` refuses `as_of` beyond the upper (`InvalidUsage`) or
before `since` (`AsOfBeforeSince`, from the lease itself, so no merge can slip in between the
check and the hold), then reads the version its lease wrote: while the lease lives, `since`
stays at or before `as_of` and the collector deletes none of that version's parts
(`gc.collect_garbage`). Its holder calls `renew` more often than `Timing.reader_lease` and
`release` when done.

Time: a holder paused longer than its lease loses both holds: the collector may delete the
pinned parts once the lease expired by its clock (and a merge replaced them), and `since` may
pass `as_of`. Nothing wrong is read then: a part is immutable, so a reader either reads it
whole or finds it gone (`PartGone`). The next `renew` sees the pin lapsed and says so, then
releases: the lease it gets back pins another version, `since` passed `as_of`, or the renewal
returned later than `LAPSE_SHARE` of a lease after the previous one started (a renewal that
lands just after the expiry keeps the seqno, yet a collector may have deleted in between; the
share leaves room for the writers' clocks to differ by a tenth of the lease). The read must
start over.
"""

from __future__ import annotations

import logging

from mvsink.core.errors import InvalidUsage
from mvsink.core.frontier import Frontier
from mvsink.shard.state import AsOfBeforeSince, ShardState
from mvsink.shard.store import PartGone, Shard

log = logging.getLogger(__name__)
#: A renewal returning later than this share of the lease after the previous one started
#: counts as lapsed.
LAPSE_SHARE = 0.9


class PinnedRead:
    """A lease holding `since` at `as_of` and pinning the parts of `state`."""

    def __init__(self, shard: Shard, reader_id: str, as_of: Frontier) -> None:
        """Take the lease (`reader_id` unique to this read).

        Raises:
            InvalidUsage: `as_of` beyond the upper, or `reader_id` holds a lease already.
            AsOfBeforeSince: `as_of` before `since`.
            PartGone: this process paused past the lease while taking it: read again.
        """
        current = shard.state()
        shard.check_readable(current, as_of)
        if current.lease(reader_id) is not None:  # a renewal would keep its hold and its pin
            raise InvalidUsage(f"{reader_id} already holds a lease on {shard.shard_id}")
        self.shard, self.reader_id, self.as_of = shard, reader_id, as_of
        self.lapsed = False
        #: When the last lease or renewal that held started (`shard.clock.monotonic`).
        self.held_from = shard.clock.monotonic()
        lease = shard.lease(reader_id, as_of, pin=True)
        assert lease.seqno is not None
        state = shard.version(lease.seqno)
        if state is None or self._late():  # paused past the lease (or version_grace) already
            shard.release(reader_id)
            raise PartGone(f"version {lease.seqno} of {shard.shard_id} was not held: read again")
        self.seqno: int = lease.seqno
        self.state: ShardState = state

    def _late(self) -> bool:
        lease = self.shard.timing.reader_lease
        return self.shard.clock.monotonic() > self.held_from + lease * LAPSE_SHARE

    def renew(self) -> bool:
        """Renew the lease; False once the pin has lapsed (the lease is then released)."""
        if self.lapsed:
            return False
        started = self.shard.clock.monotonic()
        try:
            lease = self.shard.lease(self.reader_id, self.as_of, pin=True)
        except AsOfBeforeSince:
            lease = None
        if lease is None or lease.seqno != self.seqno or self._late():
            self.lapsed = True
            log.warning(
                "the read of %s at %s lost its pin of version %d: its lease expired (the "
                "reader paused longer than reader_lease, %.0fs); a part it still needs may be "
                "gone, so a read that fails from here must start over",
                self.shard.shard_id,
                self.as_of,
                self.seqno,
                self.shard.timing.reader_lease,
            )
            self.release()
            return False
        self.held_from = started
        return True

    def release(self) -> None:
        """Drop the lease: `since` and the collector may pass what it held."""
        self.shard.release(self.reader_id)
