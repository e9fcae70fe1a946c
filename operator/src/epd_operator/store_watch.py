"""Reading each deployment's store master: its /health and /metrics every `State.store_poll_interval_s`, into
status.store and StoreReady (`store_health`), with an Event for each change worth one.

The master is read through its Service, as the store's users reach it. A failed reading is reported as it is:
a master that restarts shows as MasterUnreachable until it serves again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.request

from epd_operator.api.status import StoreStatus
from epd_operator.publish import publish_later
from epd_operator.state import State, Tracked
from epd_operator.store_health import store_events, store_status

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 3.0
"""Seconds for each of the two requests; a master that serves answers in milliseconds."""
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""No HTTP proxy from the environment: the master is reached inside the cluster, directly."""


def follow(state: State, tracked: Tracked) -> None:
    """Read the master of `tracked` while its last render has one and reading is on; stop otherwise (a spec
    change removed the store)."""
    derived = tracked.desired.derived if tracked.desired is not None else None
    wanted = state.store_poll_interval_s > 0 and derived is not None and derived.master_health_url is not None
    running = tracked.store_watch is not None and not tracked.store_watch.done()
    if wanted and not running:
        tracked.store_watch = state.spawn(_watch(state, tracked))
    elif not wanted:
        if tracked.store_watch is not None:
            tracked.store_watch.cancel()
        tracked.store_watch, tracked.store = None, None


async def _watch(state: State, tracked: Tracked) -> None:
    while state.current(tracked) and tracked.desired is not None:
        derived = tracked.desired.derived  # read again each round: a spec change may move the master
        if derived.master_health_url is None or derived.master_metrics_url is None:
            return
        reading = await read_master(derived.master_health_url, derived.master_metrics_url, derived.tenant_id)
        if reading != tracked.store and state.current(tracked):
            before, tracked.store = tracked.store, reading
            for event in store_events(before, reading):
                state.event(tracked, event.level, event.reason, event.message)
            publish_later(state, tracked)
        await asyncio.sleep(state.store_poll_interval_s)


async def read_master(health_url: str, metrics_url: str, tenant_id: str) -> StoreStatus:
    """The master's report, or why there is none."""
    try:
        health, metrics = await asyncio.to_thread(_get_both, health_url, metrics_url)
        parsed = json.loads(health)
    except (OSError, ValueError) as exc:
        return store_status(None, None, tenant_id, error=f"{health_url}: {exc}")
    if not isinstance(parsed, dict):
        return store_status(None, None, tenant_id, error=f"{health_url} answered {health[:100]!r}, not a JSON object")
    return store_status(parsed, metrics, tenant_id)


def _get_both(health_url: str, metrics_url: str) -> tuple[str, str]:
    with _DIRECT.open(health_url, timeout=READ_TIMEOUT_S) as answer:
        health = answer.read().decode(errors="replace")
    with _DIRECT.open(metrics_url, timeout=READ_TIMEOUT_S) as answer:
        return health, answer.read().decode(errors="replace")
