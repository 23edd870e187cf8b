"""Where an mvsink description's cycle goes, from the three services' logs.

With one description in flight, the sink's steady rate is one tick per cycle: from one
description minted to the next. The services log each description's milestones (the time a
log line was written, in the services' local time, to the millisecond):

```
 mint: "minted desc E.N ..."          write: "staged desc E.N ... in Ts (Spark job Js, slowest
   │                                          task's steps: {desired, persist, ..., task})"
   ├─ to_job ─┬─ job ─────────────────┬─ report ─┤
                                                 ├─ append ──── append: "appended ... desc E.N"
                                                                  ├─ to_next ─── mint: next desc
```

* `to_job`: the description on `descs`, the write driver taking it, planning the job;
* `job`: the Spark job (or the residents' round) of the staging steps; the slowest task
  (`task`) and its steps (`resolve`: waiting for the previous step's pipelined checkpoint,
  `desired`, `persist`, `consolidate`, `stage`, `checkpoint`) are within it;
* `report`: the staged batch produced to `batches` and flushed;
* `append`: the batch on `batches`, the compare-and-append, `ShardUpper` produced;
* `to_next`: `ShardUpper` on `frontiers`, mint minting and committing the next description.

`cycle` is the sum of the five. Each is the median over the descriptions minted within the
window whose milestones were all logged (a description restaged or lost to another writer is
left out), so the phases of a noisy run add up only roughly to the median cycle.
"""

from __future__ import annotations

import ast
import itertools
import re
import statistics
import time
from dataclasses import dataclass, field

#: The phases, in the order they follow each other.
PHASES = ("to_job", "job", "report", "append", "to_next")
#: The slowest task's steps, within `job`.
STEPS = ("resolve", "desired", "persist", "consolidate", "stage", "checkpoint")

# The services' log lines this module reads (`mvsink.bench.steady` and `mvsink.bench.soak` read
# them through these too): a line's time stamp, then what it says of a description.
_STAMP = r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(?P<millis>\d{3}) "
_MINTED = re.compile(_STAMP + r".*: minted desc (?P<desc>\S+) ", re.MULTILINE)
#: The write driver's line of a staging job.
STAGED = re.compile(
    _STAMP + r".*: staged desc (?P<desc>\S+) .* (?P<updates>\d+) updates in (?P<total>[\d.]+)s "
    r"\(Spark job (?P<job>[\d.]+)s, slowest task's steps: (?P<steps>\{.*\})\)",
    re.MULTILINE,
)
#: An append worker's line of a batch appended (a single-time upper).
APPENDED = re.compile(
    _STAMP + r".*: appended \d+ parts for desc (?P<desc>\S+) \[\{\d*\}, \{(?P<upper>\d+)\}\)"
    r".* in (?P<took_ms>[\d.]+) ms",
    re.MULTILINE,
)


def _at(line: re.Match[str]) -> float:
    """Seconds since the epoch of a matched log line's local time stamp."""
    stamp = time.strptime(line["at"], "%Y-%m-%d %H:%M:%S")
    return time.mktime(stamp) + int(line["millis"]) / 1000


@dataclass
class _Desc:
    minted: float
    staged: float | None = None
    total: float = 0.0
    job: float = 0.0
    steps: dict[str, float] = field(default_factory=dict)
    appended: float | None = None


def _descs(mint_log: str, write_log: str, append_log: str) -> list[_Desc]:
    """The descriptions minted, in order, with what the other two logs say of each (its first
    staging and first append)."""
    found = {m["desc"]: _Desc(_at(m)) for m in _MINTED.finditer(mint_log)}
    for m in STAGED.finditer(write_log):
        if (desc := found.get(m["desc"])) and desc.staged is None:
            desc.staged, desc.total, desc.job = _at(m), float(m["total"]), float(m["job"])
            desc.steps = ast.literal_eval(m["steps"])
    for m in APPENDED.finditer(append_log):
        if (desc := found.get(m["desc"])) and desc.appended is None:
            desc.appended = _at(m)
    return sorted(found.values(), key=lambda d: d.minted)


def cycle_phases(
    mint_log: str, write_log: str, append_log: str, window: tuple[float, float]
) -> dict[str, float]:
    """The median seconds of each phase (module docs; the slowest task's steps as
    `task.<step>`) and of the whole `cycle`, over the descriptions minted within `window`
    (seconds since the epoch) followed by another; empty if none was."""
    descs = _descs(mint_log, write_log, append_log)
    phases: dict[str, list[float]] = {}
    for desc, after in itertools.pairwise(descs):
        if not window[0] <= desc.minted <= window[1]:
            continue
        if desc.staged is None or desc.appended is None:
            continue
        started = desc.staged - desc.total
        measured = {
            "cycle": after.minted - desc.minted,
            "to_job": started - desc.minted,
            "job": desc.job,
            "report": desc.total - desc.job,
            "append": desc.appended - desc.staged,
            "to_next": after.minted - desc.appended,
            **({"task": desc.steps["task"]} if "task" in desc.steps else {}),
            **{f"task.{s}": desc.steps[s] for s in STEPS if s in desc.steps},
        }
        for name, seconds in measured.items():
            phases.setdefault(name, []).append(seconds)
    return {name: round(statistics.median(values), 4) for name, values in phases.items()}


def describe(cycle: dict[str, float]) -> str:
    """One line for the bench's report: the cycle, its phases and the slowest task's steps."""
    steps = " ".join(f"{s} {cycle[f'task.{s}']:.3f}" for s in STEPS if f"task.{s}" in cycle)
    task = f"slowest task {cycle['task']:.3f}: " if "task" in cycle else "slowest task: "
    phases = ", ".join(
        f"{p} {cycle[p]:.3f}" + (f" ({task}{steps})" if p == "job" and steps else "")
        for p in PHASES
        if p in cycle
    )
    return f"{cycle['cycle']:.3f} s a description: {phases}"
