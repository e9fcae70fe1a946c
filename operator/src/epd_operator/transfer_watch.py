"""Reading each deployment's proxy: its /health every `Settings.transfer_poll_interval_s`, whose canary report
becomes status.transfers and TransferReady (`transfer_health`); the condition's flips are the Events.

The proxy is read through its Service; with several proxy replicas any one answers, and each runs the same
canaries against the same instances.
"""

from __future__ import annotations

from epd_operator.api.status import TransferStatus
from epd_operator.polling import Poll, get_object
from epd_operator.render import Derived
from epd_operator.transfer_health import transfer_status


async def read_proxy(health_url: str) -> TransferStatus:
    """The proxy's canary report, or why there is none. A 503 (a role without a healthy instance) carries
    the report too."""
    try:
        return transfer_status(await get_object(health_url, error_body=True))
    except (OSError, ValueError) as exc:
        return transfer_status(None, error=f"{health_url}: {exc}")


async def _read(derived: Derived) -> TransferStatus:
    assert derived.proxy_health_url is not None
    return await read_proxy(derived.proxy_health_url)


POLL = Poll[TransferStatus](
    slot="transfers",
    url=lambda derived: derived.proxy_health_url,
    interval=lambda settings: settings.transfer_poll_interval_s,
    read=_read,
    notices=lambda before, after: (),
    unread=TransferStatus(reachable=False, message="not read yet"),
)
