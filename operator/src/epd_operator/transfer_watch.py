"""Reading each deployment's proxy: its /health every `State.transfer_poll_interval_s`, whose canary report
becomes status.transfers and TransferReady (`transfer_health`); the condition's flips are the Events.

The proxy is read through its Service; with several proxy replicas any one answers, and each runs the same
canaries against the same instances.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error

from epd_operator.api.status import TransferStatus
from epd_operator.polling import Poll, get_text
from epd_operator.render import Derived
from epd_operator.transfer_health import transfer_status


async def read_proxy(health_url: str) -> TransferStatus:
    """The proxy's canary report, or why there is none."""
    try:
        body = await asyncio.to_thread(_get_report, health_url)
    except OSError as exc:
        return transfer_status(None, error=f"{health_url}: {exc}")
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return transfer_status(None, error=f"{health_url} answered {body[:100]!r}, not a JSON object")
    return transfer_status(parsed)


def _get_report(url: str) -> str:
    """/health's body: a 503 (a role without a healthy instance) carries the report too."""
    try:
        return get_text(url)
    except urllib.error.HTTPError as exc:
        return str(exc.read().decode(errors="replace"))


async def _read(derived: Derived) -> TransferStatus:
    assert derived.proxy_health_url is not None
    return await read_proxy(derived.proxy_health_url)


POLL = Poll[TransferStatus](
    slot="transfers",
    url=lambda derived: derived.proxy_health_url,
    interval=lambda state: state.transfer_poll_interval_s,
    read=_read,
    notices=lambda before, after: (),
    unread=TransferStatus(reachable=False, message="not read yet"),
)
