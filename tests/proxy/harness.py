"""Run the proxy app in the test's event loop, served by uvicorn on a loopback port, with stand-in backends.

The tests call `run(coro)`: each test is one asyncio program that starts what it needs and stops it on exit.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import uvicorn

from epd_connectors.config.roles import Role
from epd_connectors.proxy.app import ProxyApp
from epd_connectors.proxy.roster import InstanceSpec, Roster
from epd_connectors.proxy.settings import Limits, ProxyOptions, Timeouts

FAST = ProxyOptions(
    timeouts=Timeouts(connect=1.0, encode=5.0, prefill=5.0, first_token=5.0, total=20.0, probe=1.0),
    limits=Limits(probe_interval_s=0.2),
)


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
    """Serve the app on a free loopback port; its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, lifespan="on", access_log=False, log_level="error", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("uvicorn stopped before it started")
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()
