"""Reading each deployment's store master: its /health and /metrics every `Settings.store_poll_interval_s`, into
status.store and StoreReady (`store_health`), with an Event for each change worth one.

The master is read through its Service, as the store's users reach it. A failed reading is reported as it is:
a master that restarts shows as MasterUnreachable until it serves again.
"""

from __future__ import annotations

import asyncio

from epd_operator.api.status import StoreStatus
from epd_operator.polling import Poll, get_object, get_text
from epd_operator.render import Derived
from epd_operator.store_health import store_events, store_status


async def read_master(health_url: str, metrics_url: str, tenant_id: str) -> StoreStatus:
    """The master's report, or why there is none."""
    try:
        health = await get_object(health_url)
        metrics = await asyncio.to_thread(get_text, metrics_url)
    except (OSError, ValueError) as exc:
        return store_status(None, None, tenant_id, error=f"{health_url}: {exc}")
    return store_status(health, metrics, tenant_id)


async def _read(derived: Derived) -> StoreStatus:
    assert derived.master_health_url is not None and derived.master_metrics_url is not None
    return await read_master(derived.master_health_url, derived.master_metrics_url, derived.tenant_id)


POLL = Poll[StoreStatus](
    slot="store",
    url=lambda derived: derived.master_health_url,
    interval=lambda settings: settings.store_poll_interval_s,
    read=_read,
    notices=store_events,
)
