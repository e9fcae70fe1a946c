"""Reading what a deployment's own servers report, on an interval: the store master (`store_watch`) and the
proxy's canaries (`transfer_watch`). One loop for both: read, keep a reading that changed in the world, enqueue the
deployment. The reconcile pass turns readings into status and Events.

A failed reading is kept as it is (its type says why there is none): a server that restarts shows as such until
it answers again.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

from epd_operator.render import Derived
from epd_operator.settings import Settings
from epd_operator.world import Key, World

T = TypeVar("T")

READ_TIMEOUT_S = 3.0
"""Seconds for each request; a server that serves answers in milliseconds."""
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""No HTTP proxy from the environment: the deployment's servers are reached inside the cluster, directly."""


class Notice(Protocol):
    """An Event to post on the EPDDeployment."""

    @property
    def level(self) -> str:
        """info or warn."""

    @property
    def reason(self) -> str: ...

    @property
    def message(self) -> str: ...


@dataclass(frozen=True)
class Poll(Generic[T]):
    """One kind of reading."""

    slot: Literal["store", "transfers"]
    """The DeploymentState field the reading lands in, and its name in the world."""
    url: Callable[[Derived], str | None]
    """What is read for the last valid render; None: nothing to read."""
    interval: Callable[[Settings], float]
    """Seconds between readings; 0: none."""
    read: Callable[[Derived], Awaitable[T]]
    notices: Callable[[T | None, T], Sequence[Notice]]
    """The Events a new reading deserves, given the one before."""
    unread: T | None = None
    """Reported until the first reading when the status holds none (None: nothing)."""

    def target(self, settings: Settings, derived: Derived | None) -> Derived | None:
        """What to read for: `derived` when it has something to read and reading is on; None otherwise."""
        on = self.interval(settings) > 0 and derived is not None and self.url(derived) is not None
        return derived if on else None


class Polls:
    """The reading tasks of every deployment, one per (deployment, slot)."""

    def __init__(self, settings: Settings, world: World, changed: Callable[[Key], None]) -> None:
        self._settings, self._world, self._changed = settings, world, changed
        self._targets: dict[tuple[Key, str], Derived] = {}
        self._tasks: dict[tuple[Key, str], asyncio.Task[None]] = {}

    def follow(self, key: Key, poll: Poll[Any], target: Derived | None) -> None:
        """Read for `target` (`Poll.target`), from now on; None stops the reading and forgets it."""
        slot = (key, poll.slot)
        if target is None:
            self._targets.pop(slot, None)
            if (task := self._tasks.pop(slot, None)) is not None:
                task.cancel()
            self._world.readings.pop(slot, None)
            return
        self._targets[slot] = target  # the running loop reads it again each round: a spec change may move it
        task = self._tasks.get(slot)
        if task is None or task.done():
            self._tasks[slot] = asyncio.create_task(self._watch(key, poll))

    def reading(self, key: Key, poll: Poll[T]) -> T | None:
        """The newest reading; None before the first."""
        found: T | None = self._world.readings.get((key, poll.slot))
        return found

    async def _watch(self, key: Key, poll: Poll[Any]) -> None:
        slot = (key, poll.slot)
        while (target := self._targets.get(slot)) is not None:
            reading = await poll.read(target)
            if slot in self._targets and reading != self._world.readings.get(slot):
                self._world.readings[slot] = reading
                self._changed(key)
            await asyncio.sleep(poll.interval(self._settings))

    def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()
        self._targets.clear()

    def running(self, key: Key, poll: Poll[Any]) -> bool:
        return (key, poll.slot) in self._tasks


def get_text(url: str) -> str:
    """GET `url` (blocking: run it in a thread); its body, OSError when there is none."""
    with DIRECT.open(url, timeout=READ_TIMEOUT_S) as answer:
        return str(answer.read().decode(errors="replace"))


async def get_object(url: str, *, error_body: bool = False) -> dict[str, Any]:
    """GET `url` for a JSON object (in a thread). OSError when there is no answer (with `error_body`, an error
    status's body counts as the answer); ValueError, saying what came, when it is not a JSON object."""
    try:
        body = await asyncio.to_thread(get_text, url)
    except urllib.error.HTTPError as exc:
        if not error_body:
            raise
        body = await asyncio.to_thread(_body_of, exc)
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ValueError(f"answered {body[:100]!r}, not a JSON object")
    return parsed


def _body_of(error: urllib.error.HTTPError) -> str:
    return str(error.read().decode(errors="replace"))
