"""Figures of a benchmark measured in repeats, summarised the same way for every figure.

`mvsink bench --repeats N` runs the systems interleaved (A B C A B C ...) and computes each
repeat's figures on their own, ratios included, so a ratio is always of two figures from the
same repeat. `summarise` then folds the repeats into one figures dict: every number is the
median over the repeats, with its `[min, max]` in `spread`; a flag (`*_equals_desired`) holds
only when it held in every repeat; a per-process peak RSS is the largest seen. The repeats'
own figures stay under `repeats`, so nothing measured is thrown away.
"""

from __future__ import annotations

import statistics
from typing import Any


def summarise(per_repeat: list[dict[str, Any]]) -> dict[str, Any]:
    """One figures dict for `per_repeat` (module docs); a single repeat is returned as it is,
    with a spread of width 0 for each number."""
    if not per_repeat:
        raise ValueError("no repeats to summarise")
    spread: dict[str, list[float]] = {}
    out = _fold(per_repeat, spread, "")
    out["spread"] = spread
    out["repeats"] = per_repeat
    return out


def _fold(
    values: list[dict[str, Any]], spread: dict[str, list[float]], prefix: str
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for v in values for k in v):
        seen = [v[key] for v in values if key in v]
        numbers = [x for x in seen if _is_number(x)]
        if any(isinstance(x, bool) for x in seen):
            out[key] = all(x is True for x in seen) if all(x is not None for x in seen) else None
        elif numbers and len(numbers) == len(seen):
            if key.endswith("_peak_rss_mib") or prefix.endswith("_peak_rss_mib."):
                out[key] = max(numbers)
            else:
                out[key] = _median(numbers)
            spread[prefix + key] = [min(numbers), max(numbers)]
        elif all(isinstance(x, dict) for x in seen):
            out[key] = _fold(seen, spread, f"{prefix}{key}.")
        else:
            # None where a repeat could not measure it, strings, lists: the first repeat's
            # value where they agree, else None (the repeats keep each one's).
            out[key] = seen[0] if all(x == seen[0] for x in seen) else None
    return out


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _median(numbers: list[float]) -> float:
    median = statistics.median(numbers)
    # an int figure stays an int when the repeats agree on it (counts, sizes)
    if all(isinstance(x, int) for x in numbers) and float(median).is_integer():
        return int(median)
    return round(float(median), 3)


def short(value: float) -> str:
    """A figure in few characters: 812k, 1.23M, 0.42."""
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:.2f}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:.0f}k"
    if magnitude >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}"


def cell(figures: dict[str, Any], key: str, unit: str = "") -> str:
    """`key`'s median with its min-max when the repeats differ: `812k [790k-830k]`."""
    value = figures.get(key)
    if value is None:
        return "-"
    if not _is_number(value):
        return f"{value}{unit}"
    text = short(value)
    low_high = figures.get("spread", {}).get(key)
    if low_high and len(figures.get("repeats", ())) > 1:
        text += f" [{short(low_high[0])}-{short(low_high[1])}]"
    return text + unit
