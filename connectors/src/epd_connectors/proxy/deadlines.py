"""Time limits on the request path (first token, prefill, the gap between stream chunks, the whole request),
checked by one sweep.

A timer per limit per request costs more than limits of minutes are worth: a sweep every `period_s` finds the
overdue ones instead, late by at most that period. `TimeLimit` is the context manager the request path uses,
like `asyncio.timeout` but without its timer, rescheduling and state checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

MAX_PERIOD_S = 1.0
"""Longest time between sweeps: limits are minutes by default, a second more or less does not matter."""


class Deadline:
    """One task's limit: the sweep cancels `task` once `due` passed and marks it `expired`. `due` may move (a
    stream's stall limit restarts with every chunk)."""

    __slots__ = ("due", "expired", "task")

    def __init__(self, task: asyncio.Task[object], due: float) -> None:
        self.task = task
        self.due = due
        self.expired = False


class Deadlines:
    """Every limit in force; `start` the sweep in the app's start-up, `stop` it at the end. The sweep runs every
    quarter of the shortest limit given here (at most every `MAX_PERIOD_S`), so no limit overruns by more
    than a quarter."""

    def __init__(self, *limits_s: float) -> None:
        self.period_s = min(MAX_PERIOD_S, *(limit / 4 for limit in limits_s))
        self._live: set[Deadline] = set()
        self._sweeper: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep())

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper

    def limit(self, seconds: float) -> TimeLimit:
        """A block that raises TimeoutError when it takes longer than `seconds` (enter it inside the task)."""
        return TimeLimit(self, seconds)

    def add(self, task: asyncio.Task[object], seconds: float) -> Deadline:
        deadline = Deadline(task, time.monotonic() + seconds)
        self._live.add(deadline)
        return deadline

    def discard(self, deadline: Deadline) -> None:
        self._live.discard(deadline)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            now = time.monotonic()
            for deadline in [d for d in self._live if d.due <= now and not d.expired]:
                deadline.expired = True
                deadline.task.cancel()


class TimeLimit:
    """TimeoutError when the block takes longer than its limit. The cancellation it caused is taken back
    first, so a limit nested in another (or in a cancelled task) raises only for itself."""

    __slots__ = ("_deadline", "_deadlines", "_seconds")

    def __init__(self, deadlines: Deadlines, seconds: float) -> None:
        self._deadlines = deadlines
        self._seconds = seconds

    def __enter__(self) -> None:
        task = asyncio.current_task()
        assert task is not None, "TimeLimit outside a task"
        self._deadline = self._deadlines.add(task, self._seconds)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: object) -> None:
        deadline = self._deadline
        self._deadlines.discard(deadline)
        if deadline.expired and kind is asyncio.CancelledError and deadline.task.uncancel() == 0:
            raise TimeoutError from exc
