"""Peak resident memory of process trees while a benchmark runs (a process and all its
descendants, read from /proc; Linux)."""

from __future__ import annotations

import os
import threading


def _process_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, rss bytes) of every process."""
    page = os.sysconf("SC_PAGE_SIZE")
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            table[int(entry)] = (int(fields[1]), int(fields[21]) * page)
        except (OSError, IndexError, ValueError):
            continue
    return table


class RssSampler:
    """Peak RSS of process trees (a process and all its descendants), sampled 4x a second."""

    def __init__(self, roots: dict[str, int]) -> None:
        self.roots = roots
        self.peak = dict.fromkeys(roots, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            table = _process_table()
            children: dict[int, list[int]] = {}
            for pid, (ppid, _) in table.items():
                children.setdefault(ppid, []).append(pid)
            for label, root in self.roots.items():
                total, stack = 0, [root]
                while stack:
                    pid = stack.pop()
                    total += table.get(pid, (0, 0))[1]
                    stack.extend(children.get(pid, []))
                self.peak[label] = max(self.peak[label], total)

    def stop(self) -> dict[str, float]:
        """Stop; the peaks in MiB."""
        self._stop.set()
        self._thread.join(2)
        return {label: round(peak / 2**20, 1) for label, peak in self.peak.items()}


# -- systems ------------------------------------------------------------------------------------
