"""Encoders scaled to zero (autoscaling.minReplicas 0): the proxy is ready without them and text requests go
on; a media request is held, counted in epd_proxy_requests_waiting (what KEDA wakes the encoders on), until an
encoder joins the roster, then served through it; past the bound it is a 503 with Retry-After.

Stand-in backends; an encoder "starting" is a stand-in joining the roster, as discovery adds a pod once its
EndpointSlice shows it ready.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import aiohttp

from epd_connectors.config.roles import Role
from epd_connectors.proxy.app import ProxyApp
from epd_connectors.proxy.errors import RETRY_AFTER_S
from epd_connectors.proxy.roster import InstanceSpec, Roster
from tests.proxy.harness import FAST, data_url, run, serving
from tests.proxy.stand_ins import StandIn, running

WAKE_S = 5.0
SHORT_WAKE_S = 0.5
WAITING = 'epd_proxy_requests_waiting{role="encoder"}'


def chat(*urls: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": "describe"}]
    content += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return {"model": "tiny", "messages": [{"role": "user", "content": content}]}


def at_zero(pd: StandIn) -> Roster:
    """Encoders may be at zero, and are: an empty encoder list (discovery fills it)."""
    return Roster.build(
        {Role.ENCODER: [], Role.PD: [InstanceSpec(pd.url)]}, healthy=True, optional=frozenset({Role.ENCODER})
    )


async def waiting(session: aiohttp.ClientSession, url: str) -> float:
    text = await (await session.get(url + "/metrics")).text()
    return next(float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith(WAITING))


def test_a_media_request_waits_for_an_encoder_and_text_never_does() -> None:
    async def main() -> None:
        enc, pd = StandIn("e0", role="encoder"), StandIn("pd0")
        async with running(enc, pd):
            app = ProxyApp(at_zero(pd), replace(FAST, encoder_wake_s=WAKE_S))
            async with serving(app) as url, aiohttp.ClientSession() as session:
                health = await session.get(url + "/health")
                assert health.status == 200, await health.text()  # ready with no encoder at all
                async with session.post(url + "/v1/chat/completions", json=chat()) as text_answer:
                    assert text_answer.status == 200
                assert await waiting(session, url) == 0.0
                held = asyncio.create_task(session.post(url + "/v1/chat/completions", json=chat(data_url("cat"))))
                for _ in range(100):
                    if await waiting(session, url) == 1.0:
                        break
                    await asyncio.sleep(0.02)
                assert await waiting(session, url) == 1.0, "the held request is counted"
                assert not held.done() and enc.requests == []
                app.roster.replace(Role.ENCODER, [InstanceSpec(enc.url)], healthy=True)  # an encoder came up
                answer = await held
                assert answer.status == 200, await answer.text()
                assert await waiting(session, url) == 0.0
        assert len(enc.requests) == 1
        assert pd.requests[-1]["messages"][0]["content"][1]["type"] == "image_embeds"

    run(main)


def test_no_encoder_within_the_bound_is_a_503_with_retry_after() -> None:
    async def main() -> None:
        pd = StandIn("pd0")
        async with running(pd):
            app = ProxyApp(at_zero(pd), replace(FAST, encoder_wake_s=SHORT_WAKE_S))
            async with serving(app) as url, aiohttp.ClientSession() as session:
                loop = asyncio.get_running_loop()
                began = loop.time()
                async with session.post(url + "/v1/chat/completions", json=chat(data_url("cat"))) as answer:
                    took = loop.time() - began
                    assert answer.status == 503
                    assert answer.headers["Retry-After"] == str(RETRY_AFTER_S)
                    assert "no encoder came up within" in await answer.text()
                assert await waiting(session, url) == 0.0
        assert took >= SHORT_WAKE_S
        assert pd.requests == []

    run(main)
