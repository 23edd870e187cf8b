"""The full bench's repeats, pure parts: figures summarised as median [min-max] with ratios
taken per repeat, and the view the workload holds after any tick (what a window bounded by
time is checked against)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mvsink.bench.repeats import cell, short, summarise
from mvsink.bench.workload import Workload


def test_numbers_are_medians_with_their_min_and_max() -> None:
    figures = summarise(
        [
            {"mvsink_updates_per_s": 700_000.0, "ratio_vs_peer": 3.5, "mvsink_table_bytes": 10},
            {"mvsink_updates_per_s": 900_000.0, "ratio_vs_peer": 4.5, "mvsink_table_bytes": 30},
            {"mvsink_updates_per_s": 800_000.0, "ratio_vs_peer": 5.0, "mvsink_table_bytes": 20},
        ]
    )
    assert figures["mvsink_updates_per_s"] == 800_000.0
    assert figures["spread"]["mvsink_updates_per_s"] == [700_000.0, 900_000.0]
    # a ratio is the median of the repeats' ratios, never a ratio of medians
    assert figures["ratio_vs_peer"] == 4.5
    assert figures["mvsink_table_bytes"] == 20 and isinstance(figures["mvsink_table_bytes"], int)
    assert len(figures["repeats"]) == 3


def test_flags_hold_only_when_every_repeat_held_them() -> None:
    figures = summarise(
        [
            {"mvsink_shard_equals_desired": True, "peer_x": None},
            {"mvsink_shard_equals_desired": False, "peer_x": None},
        ]
    )
    assert figures["mvsink_shard_equals_desired"] is False
    assert figures["peer_x"] is None
    assert summarise([{"ok": True}, {"ok": True}])["ok"] is True


def test_peak_rss_is_the_largest_and_nested_dicts_fold() -> None:
    figures = summarise(
        [
            {"mvsink_peak_rss_mib": {"write": 900.0, "mint": 80.0}, "workload": {"keys": 5}},
            {"mvsink_peak_rss_mib": {"write": 1100.0, "mint": 70.0}, "workload": {"keys": 5}},
        ]
    )
    assert figures["mvsink_peak_rss_mib"] == {"write": 1100.0, "mint": 80.0}
    assert figures["workload"] == {"keys": 5}
    assert figures["spread"]["mvsink_peak_rss_mib.write"] == [900.0, 1100.0]


def test_a_figure_missing_from_a_repeat_is_the_median_of_those_that_have_it() -> None:
    figures = summarise([{"a": 1.0}, {"a": 3.0, "b": 2.0}])
    assert figures["a"] == 2.0 and figures["b"] == 2.0


def test_no_repeats_is_an_error() -> None:
    with pytest.raises(ValueError, match="no repeats"):
        summarise([])


@given(st.lists(st.floats(0.01, 1e7), min_size=1, max_size=7))
def test_the_median_lies_within_the_spread(values: list[float]) -> None:
    figures = summarise([{"x": v} for v in values])
    low, high = figures["spread"]["x"]
    assert low == min(values) and high == max(values)
    assert low - 1e-3 <= figures["x"] <= high + 1e-3


def test_cells_show_the_spread_only_over_repeats() -> None:
    assert short(812_345.0) == "812k" and short(1_234_567.0) == "1.23M" and short(0.42) == "0.42"
    one = summarise([{"x": 812_345.0}])
    assert cell(one, "x") == "812k"
    three = summarise([{"x": 700_000.0}, {"x": 812_345.0}, {"x": 1_234_567.0}])
    assert cell(three, "x", "/s") == "812k [700k-1.23M]/s"
    assert cell(three, "missing") == "-"


@pytest.mark.parametrize("tick", [0, 1, 4, 7])
def test_the_view_after_a_tick_is_the_shorter_workloads_final_view(tick: int) -> None:
    workload = Workload(200, 0.2, 7, partitions=4)
    tables, _ = workload.generate()
    _, expected = replace(workload, ticks=tick).generate()
    assert workload.view_at(tick).equals(expected)
    # and it is what ticks 0..tick sum to
    total: dict[tuple[str, int], int] = {}
    for table in tables[: tick + 1]:
        for row in table.to_pylist():
            key = (row["key"], row["value"])
            total[key] = total.get(key, 0) + row["_diff"]
    view = workload.view_at(tick)
    assert {k for k, d in total.items() if d} == set(
        zip(view.column("key").to_pylist(), view.column("value").to_pylist(), strict=True)
    )
