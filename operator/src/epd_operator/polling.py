"""Reading what a deployment's own servers report, on an interval, into its status: the store master
(`store_watch`) and the proxy's canaries (`transfer_watch`). One loop for both: read, keep a reading that
changed, post the Events it deserves, publish.

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

from epd_operator.publish import publish_later
from epd_operator.render import Derived
from epd_operator.state import State, Tracked

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
    """The Tracked attribute the reading lands in, and the name of its task."""
    url: Callable[[Derived], str | None]
    """What is read for the last valid render; None: nothing to read (the watch stops)."""
    interval: Callable[[State], float]
    """Seconds between readings; 0: none."""
    read: Callable[[Derived], Awaitable[T]]
    notices: Callable[[T | None, T], Sequence[Notice]]
    """The Events a new reading deserves, given the one before."""
    unread: T | None = None
    """Kept until the first reading when the status holds none (None: nothing)."""


def follow(state: State, tracked: Tracked, poll: Poll[Any]) -> None:
    """Read for `tracked` while its last render has something to read and reading is on; stop otherwise (a
    spec change removed what was read)."""
    derived = tracked.desired.derived if tracked.desired is not None else None
    wanted = poll.interval(state) > 0 and derived is not None and poll.url(derived) is not None
    task = tracked.polls.get(poll.slot)
    if wanted and (task is None or task.done()):
        if getattr(tracked, poll.slot) is None:
            setattr(tracked, poll.slot, poll.unread)
        tracked.polls[poll.slot] = state.spawn(_watch(state, tracked, poll))
    elif not wanted:
        if task is not None:
            task.cancel()
        tracked.polls.pop(poll.slot, None)
        setattr(tracked, poll.slot, None)


async def _watch(state: State, tracked: Tracked, poll: Poll[T]) -> None:
    while state.current(tracked) and tracked.desired is not None:
        derived = tracked.desired.derived  # read again each round: a spec change may move what is read
        if poll.url(derived) is None:
            return
        reading = await poll.read(derived)
        before = getattr(tracked, poll.slot)
        if reading != before and state.current(tracked):
            setattr(tracked, poll.slot, reading)
            for notice in poll.notices(before, reading):
                state.event(tracked, notice.level, notice.reason, notice.message)
            publish_later(state, tracked)
        await asyncio.sleep(poll.interval(state))


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
