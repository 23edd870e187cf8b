"""Peak resident memory and CPU time of process trees while a benchmark runs (a process and all
its descendants, read from /proc; Linux)."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping


def _process_table() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, rss bytes, CPU clock ticks: user and system, its own and its reaped
    children's) of every process."""
    page = os.sysconf("SC_PAGE_SIZE")
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            cpu = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
            table[int(entry)] = (int(fields[1]), int(fields[21]) * page, cpu)
        except (OSError, IndexError, ValueError):
            continue
    return table


def _children(table: dict[int, tuple[int, int, int]]) -> dict[int, list[int]]:
    """pid -> its children's pids, in `table`."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    return children


def _trees(
    table: dict[int, tuple[int, int, int]], roots: Mapping[str, int]
) -> dict[str, tuple[int, int]]:
    """label -> (rss bytes, CPU clock ticks) summed over each root's tree in `table`."""
    children = _children(table)
    sums = {}
    for label, root in roots.items():
        rss = cpu = 0
        stack = [root]
        while stack:
            pid = stack.pop()
            _, pid_rss, pid_cpu = table.get(pid, (0, 0, 0))
            rss, cpu = rss + pid_rss, cpu + pid_cpu
            stack.extend(children.get(pid, []))
        sums[label] = (rss, cpu)
    return sums


def tree(root: int) -> list[int]:
    """`root` and every live descendant of it (pids)."""
    children = _children(_process_table())
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def cpu_seconds(roots: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds (user and system) each root's tree has used so far: its live processes' own
    and what they have reaped of their exited children's. A difference of two readings is
    what the tree used in between, except for processes that exited unreaped meanwhile."""
    tick = os.sysconf("SC_CLK_TCK")
    return {label: cpu / tick for label, (_, cpu) in _trees(_process_table(), roots).items()}


class RssSampler:
    """Peak RSS of process trees (a process and all its descendants), sampled 4x a second."""

    def __init__(self, roots: dict[str, int]) -> None:
        self.roots = dict(roots)
        self.peak = dict.fromkeys(roots, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            for label, (rss, _) in _trees(_process_table(), self.roots).items():
                self.peak[label] = max(self.peak[label], rss)

    def stop(self) -> dict[str, float]:
        """Stop; the peaks in MiB."""
        self._stop.set()
        self._thread.join(2)
        return {label: round(peak / 2**20, 1) for label, peak in self.peak.items()}
