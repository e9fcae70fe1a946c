"""A work queue of keys, as controller-runtime's: a key is queued at most once, never worked on twice at the same
time, and a key added while it is worked on is worked on again afterwards.

Adding with a delay coalesces: a key already due sooner keeps its turn, one due later is brought forward. The
work returns when to come back (seconds) or None.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

ERROR_RETRY_S = 10.0
"""When the work raised (a bug, not an API answer: those it handles), the next attempt."""


class WorkQueue(Generic[K]):
    def __init__(self, work: Callable[[K], Awaitable[float | None]]) -> None:
        self._work = work
        self._due: dict[K, float] = {}
        """Queued keys and when each is due (the loop's clock)."""
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._running: dict[K, asyncio.Task[None]] = {}

    def add(self, key: K, delay: float = 0.0) -> None:
        """Work on `key` after `delay` seconds (or sooner, if it is due sooner already)."""
        loop = asyncio.get_running_loop()
        due = loop.time() + max(delay, 0.0)
        if self._due.get(key, math.inf) <= due:
            return
        self._due[key] = due
        if (timer := self._timers.pop(key, None)) is not None:
            timer.cancel()
        self._timers[key] = loop.call_at(due, self._fire, key)

    def due(self, key: K) -> float | None:
        """Seconds until `key` is worked on; None when it is not queued."""
        when = self._due.get(key)
        return None if when is None else max(0.0, when - asyncio.get_running_loop().time())

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        if key in self._running:
            return  # its run picks it up when it ends
        self._due.pop(key, None)
        self._running[key] = asyncio.create_task(self._run(key))

    async def _run(self, key: K) -> None:
        again: float | None
        try:
            again = await self._work(key)
        except Exception:
            log.exception("work on %s failed; again in %.0f s", key, ERROR_RETRY_S)
            again = ERROR_RETRY_S
        finally:
            del self._running[key]
        if again is not None:
            self.add(key, again)
        if key in self._due and key not in self._timers:  # it came due while this run was on
            self._fire(key)

    async def idle(self) -> None:
        """Until no key is worked on and none is due now (tests; keys due later are left queued)."""
        loop = asyncio.get_running_loop()
        while self._running or any(when <= loop.time() for when in self._due.values()):
            await asyncio.sleep(0.005)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        for task in self._running.values():
            task.cancel()
        self._timers.clear()
        self._due.clear()
