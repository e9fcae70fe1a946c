"""What the e2e tier needs of a machine's memory, sampled once a second from a daemon thread.

Two measures, because the machine may be shared: the tier's own processes (the PSS of the pytest process and
every descendant: vLLM API servers, engine cores, proxies, Mooncake processes), which is what a CI machine must
hold for it; and the whole machine's use (MemTotal - MemAvailable), which includes anything else running.
PSS splits shared pages (the torch libraries every instance maps) between their users, so the sum over the
processes is what they really take together, unlike RSS.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

PROC = Path("/proc")
GIB = 1024**3


def machine_used_bytes() -> int:
    """MemTotal - MemAvailable: what the machine could not hand out now (droppable page cache is not counted)."""
    fields: dict[str, int] = {}
    for line in (PROC / "meminfo").read_text(encoding="ascii").splitlines():
        name, _, rest = line.partition(":")
        fields[name] = int(rest.split()[0]) * 1024
    return fields["MemTotal"] - fields["MemAvailable"]


def descendants(root: int) -> list[int]:
    """`root` and every process below it (by parent pid, read from /proc/<pid>/stat)."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            # The command name (field 2) may hold spaces and parentheses: the fields after its last ')' are fixed.
            after_name = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(after_name[1]), []).append(int(entry.name))
    found, queue = [], [root]
    while queue:
        pid = queue.pop()
        found.append(pid)
        queue.extend(children.get(pid, []))
    return found


def pss_bytes(pids: list[int]) -> int:
    """The summed proportional set size of these processes (a process gone meanwhile counts 0)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in (PROC / str(pid) / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
    return total


class MemorySampler:
    """Samples both measures every `interval_s` until stopped; keeps the peaks, the tier's per label."""

    def __init__(self, label: Callable[[], str], interval_s: float = 1.0) -> None:
        self.label = label
        """What runs now (the test module), so each part's peak can be told apart."""
        self.interval_s = interval_s
        self.machine_at_start = self.machine_peak = machine_used_bytes()
        self.own_peak = 0
        self.own_peak_after_s = 0.0
        self.own_peaks: dict[str, int] = {}
        """Per label, the tier's highest sample while it ran."""
        self._root = os.getpid()
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="e2e-memory-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            label = self.label()
            own = pss_bytes(descendants(self._root))
            self.machine_peak = max(self.machine_peak, machine_used_bytes())
            self.own_peaks[label] = max(own, self.own_peaks.get(label, 0))
            if own > self.own_peak:
                self.own_peak, self.own_peak_after_s = own, time.monotonic() - self._started

    def report(self) -> list[str]:
        """Lines for the terminal summary."""
        lines = [
            f"{'peak memory of the tier (PSS of its processes)':<56} {self.own_peak / GIB:8.1f} GiB "
            f"({self.own_peak_after_s:.0f} s into the stage)",
            f"{'peak used memory of the machine (MemTotal - MemAvailable)':<56} {self.machine_peak / GIB:8.1f} GiB "
            f"({self.machine_at_start / GIB:.1f} GiB in use at the start; other jobs count too)",
        ]
        lines += [f"{'  tier peak while ' + label:<56} {peak / GIB:8.1f} GiB" for label, peak in self.own_peaks.items()]
        return lines
