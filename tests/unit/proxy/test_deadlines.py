"""The request path's time limits: one sweep cancels what is overdue, each limit raises only for itself."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from epd_connectors.proxy.deadlines import MAX_PERIOD_S, Deadlines


def test_the_sweep_runs_every_quarter_of_the_shortest_limit_at_most_every_second() -> None:
    assert Deadlines(3600.0, 0.4).period_s == pytest.approx(0.1)
    assert Deadlines(3600.0, 300.0).period_s == MAX_PERIOD_S


def run_swept(deadlines: Deadlines, work: Callable[[], Coroutine[Any, Any, float]], cancel_after: float = 0) -> float:
    """`work` as a task while the sweep runs (cancelled from outside after `cancel_after` s, when given)."""

    async def main() -> float:
        deadlines.start()
        try:
            task = asyncio.create_task(work())
            if cancel_after:
                asyncio.get_running_loop().call_later(cancel_after, task.cancel)
            return await task
        finally:
            await deadlines.stop()

    return asyncio.run(main())


def test_an_overdue_block_raises_timeout_within_a_sweep_period() -> None:
    deadlines = Deadlines(0.2)

    async def overdue() -> float:
        started = time.monotonic()
        with pytest.raises(TimeoutError), deadlines.limit(0.2):
            await asyncio.sleep(5)
        return time.monotonic() - started

    elapsed = run_swept(deadlines, overdue)
    assert 0.2 <= elapsed < 0.2 + deadlines.period_s + 0.2


def test_a_nested_limit_raises_for_itself_and_leaves_the_outer_one_running() -> None:
    deadlines = Deadlines(10.0, 0.2)

    async def nested() -> float:
        with deadlines.limit(10.0):
            with pytest.raises(TimeoutError), deadlines.limit(0.2):
                await asyncio.sleep(5)
            await asyncio.sleep(0.3)  # no cancellation is left over for the outer block
            task = asyncio.current_task()
            assert task is not None and task.cancelling() == 0
        return 0.0

    run_swept(deadlines, nested)


def test_a_block_done_in_time_is_not_cancelled_later() -> None:
    deadlines = Deadlines(0.2)

    async def quick() -> float:
        with deadlines.limit(0.2):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # past the limit: the finished block's deadline is gone
        return 0.0

    run_swept(deadlines, quick)


def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    deadlines = Deadlines(5.0)

    async def cancelled() -> float:
        with deadlines.limit(5.0):
            await asyncio.sleep(5)
        return 0.0

    with pytest.raises(asyncio.CancelledError):
        run_swept(deadlines, cancelled, cancel_after=0.1)
