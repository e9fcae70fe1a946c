"""Run the proxy app in the test's event loop, served by its own server on a loopback port, with stand-in backends.

The tests call `run(coro)`: each test is one asyncio program that starts what it needs and stops it on exit.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from epd_connectors.config.roles import Role
from epd_connectors.proxy.app import ProxyApp
from epd_connectors.proxy.roster import InstanceSpec, Roster
from epd_connectors.proxy.server import Server
from epd_connectors.proxy.settings import Canary, Limits, ProxyOptions, Timeouts

FAST = ProxyOptions(
    timeouts=Timeouts(connect=1.0, encode=5.0, prefill=5.0, first_token=5.0, total=20.0, probe=1.0),
    limits=Limits(probe_interval_s=0.2),
    canary=Canary(interval_s=0),
)
"""Short limits, and no canaries: the tests count what each stand-in got (test_canaries turns them on)."""


def data_url(tag: str) -> str:
    """A valid base64 data URL whose payload is `tag` (the proxy checks data URLs decode; stand-ins never look)."""
    return "data:image/png;base64," + base64.b64encode(tag.encode()).decode()


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 60))


def roster_of(roles: Mapping[Role, Sequence[Any]], **extra: Mapping[str, InstanceSpec]) -> Roster:
    """A roster of stand-ins (or URLs); instances start healthy (the prober confirms them)."""
    specs = {
        role: [s if isinstance(s, InstanceSpec) else InstanceSpec(getattr(s, "url", s)) for s in members]
        for role, members in roles.items()
    }
    return Roster.build(specs, healthy=True)


async def post_json(session: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    """POST JSON; the status and the JSON answer."""
    async with session.post(url, json=body) as response:
        return response.status, await response.json()


@asynccontextmanager
async def serving(app: ProxyApp) -> AsyncIterator[str]:
    """Serve the app on a free loopback port, as `epd-proxy` does; its base URL."""
    sock = Server.listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    await app.startup()
    server = Server(app, error_body=app.error_body, clients=app.options.clients)
    server.start(sock)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await server.stop(1.0)
        await app.shutdown()
