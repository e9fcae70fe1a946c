"""How often the operator may repair one child: a few times at once, then once per interval.

A hand edit or a deletion is repaired at once. But a child that something keeps changing (a second controller
writing a field we own, a script in a loop) would get one repair per change, each a write, and the two writers
would trade the object as fast as the API server lets them. A token bucket per child lets the first repairs
through at once and spaces out the rest. Pure: the caller passes the time and does the waiting.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

DEFAULT_BURST = 3
"""Repairs of one child allowed back to back: a person's edit, its repair, a second try, and one to spare."""
DEFAULT_INTERVAL_S = 20.0
"""Seconds per repair of one child after that: a fight with another writer costs a few writes a minute."""


@dataclass
class Pacer:
    """A token bucket per key, full at first; a turn costs one token, and tokens come back one per interval."""

    burst: int = DEFAULT_BURST
    interval_s: float = DEFAULT_INTERVAL_S
    _buckets: dict[Hashable, tuple[float, float]] = field(default_factory=dict)
    """key -> (tokens left, when that was counted); tokens below zero are turns already promised."""

    def wait(self, key: Hashable, now: float) -> float:
        """Take a turn for `key` at `now` (monotonic seconds): how long to wait before acting (0: at once)."""
        tokens, then = self._buckets.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) / self.interval_s) - 1.0
        self._buckets[key] = (tokens, now)
        return 0.0 if tokens >= 0 else -tokens * self.interval_s

    def forget(self, keys: Iterable[Hashable]) -> None:
        """Drop the buckets of keys that are gone (their owner was deleted)."""
        for key in keys:
            self._buckets.pop(key, None)
