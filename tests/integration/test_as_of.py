"""A sink whose `as_of` is beyond its shard's upper (the seed's
`advance_persist_frontiers_at_startup`): mint's first lower is `as_of`, the write driver counts
the shard as at `as_of` and advances its corrections there, append moves the upper to `as_of`
before the first batch. Real mint, write (Spark) and append."""

from __future__ import annotations

import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from sinkkit import Hosted, Sink, Upstream, contents, converged, wait_until

from mvsink.core.frontier import Frontier
from mvsink.core.updates import TIME

pytestmark = pytest.mark.integration
AS_OF = 100


def test_a_sink_with_as_of_100_on_a_fresh_shard_converges_with_every_earlier_update_advanced(
    hosted: Hosted, hosted_sinks: Callable[..., Sink]
) -> None:
    """On the session's shared deployment, which takes `as_of` from the sink's definition."""
    sink = hosted_sinks(as_of=AS_OF)
    upstream = Upstream(sink)
    for _ in range(5):  # desired at times 0-4, its progress at 5: before as_of, nothing to mint
        upstream.tick()
    wait_until(
        lambda: "desired partitions assigned" in hosted.text("write", sink), 120, "write ready"
    )
    time.sleep(3)
    assert "minted desc" not in hosted.text("mint", sink)
    assert sink.shard.upper() == Frontier.at(0)  # append runs: no batch, so no upper to move

    upstream.frontier = AS_OF  # the next tick is at time 100
    upstream.tick()
    wait_until(lambda: converged(sink, upstream), 120, "convergence at 101")
    assert "minted desc 0.0 [{100}, {101})" in hosted.text("mint", sink)
    assert contents(sink, AS_OF) == {}  # every update before 100 was advanced to 100
    parts = [sink.shard.read_part(part) for part in sink.shard.state().parts()]
    times = pc.min_max(pa.concat_tables(parts).column(TIME)).as_py()
    assert parts and times["min"] >= AS_OF, times
    upstream.tick()
    wait_until(lambda: converged(sink, upstream), 120, "convergence at 102")
