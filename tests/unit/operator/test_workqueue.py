"""The controller's work queue: a key is worked on once however often it is added, never twice at once, again when
added during its run, sooner when added sooner, and again after the delay its work asks for (or after a failure)."""

from __future__ import annotations

import asyncio

import pytest

from epd_operator import workqueue
from epd_operator.workqueue import WorkQueue
from tests.unit.operator.test_status_runtime import until

pytestmark = pytest.mark.unit


def test_adds_before_a_run_coalesce_into_one() -> None:
    runs: list[str] = []

    async def work(key: str) -> None:
        runs.append(key)

    async def scenario() -> None:
        queue = WorkQueue(work)
        for _ in range(5):
            queue.add("a")
        queue.add("b")
        await queue.idle()

    asyncio.run(scenario())
    assert sorted(runs) == ["a", "b"]


def test_a_key_added_during_its_run_runs_again_after_it_never_beside_it() -> None:
    running: set[str] = set()
    overlaps: list[str] = []
    runs: list[int] = []

    async def scenario() -> None:
        release = asyncio.Event()

        async def work(key: str) -> None:
            if key in running:
                overlaps.append(key)
            running.add(key)
            runs.append(len(runs))
            if len(runs) == 1:
                await release.wait()
            running.discard(key)

        queue = WorkQueue(work)
        queue.add("a")
        await asyncio.sleep(0.01)
        queue.add("a")  # during the first run
        queue.add("a")
        await asyncio.sleep(0.01)
        assert runs == [0], "not beside the running one"
        release.set()
        await queue.idle()

    asyncio.run(scenario())
    assert runs == [0, 1] and overlaps == []


def test_a_sooner_add_brings_a_delayed_key_forward_and_a_later_one_does_not_put_it_off() -> None:
    async def scenario() -> tuple[float | None, float | None, float | None]:
        async def work(key: str) -> None:
            return None

        queue = WorkQueue(work)
        queue.add("a", 10.0)
        later = queue.due("a")
        queue.add("a", 60.0)
        kept = queue.due("a")
        queue.add("a", 0.0)
        await queue.idle()
        return later, kept, queue.due("a")

    later, kept, after = asyncio.run(scenario())
    assert later is not None and kept is not None and 9 < kept <= later <= 10
    assert after is None, "ran, and nothing is queued"


def test_the_work_decides_when_it_comes_back_and_a_failure_comes_back_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # Lower bounds only: a loaded machine may run a pass late, never early.
    monkeypatch.setattr(workqueue, "ERROR_RETRY_S", 0.3)
    calls: dict[str, list[float]] = {"again": [], "broken": []}

    async def work(key: str) -> float | None:
        calls[key].append(asyncio.get_running_loop().time())
        if key == "again" and len(calls[key]) == 1:
            return 0.2
        if key == "broken" and len(calls[key]) == 1:
            raise RuntimeError("a bug")
        return None

    async def scenario() -> None:
        queue = WorkQueue(work)
        queue.add("again")
        queue.add("broken")
        await until(lambda: all(len(times) == 2 for times in calls.values()), "each key's second pass")
        await queue.idle()
        assert queue.due("again") is None and queue.due("broken") is None, "each came back once, then was done"

    asyncio.run(scenario())
    assert [len(times) for times in calls.values()] == [2, 2]
    assert calls["again"][1] - calls["again"][0] >= 0.2, "came back when the work said"
    assert calls["broken"][1] - calls["broken"][0] >= 0.3, "a failure comes back after ERROR_RETRY_S"
