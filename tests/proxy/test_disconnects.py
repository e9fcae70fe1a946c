"""A client that goes away costs nothing after it is gone: every backend request made for it is closed at once
(vLLM aborts a request whose connection closes), wherever the request was, and nothing stays counted against
an instance. The stand-ins poll their connection every 10 ms, so "at once" is checked as within 0.25 s."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import aiohttp

from epd_connectors.config.roles import Role
from epd_connectors.proxy.app import ProxyApp
from epd_connectors.proxy.settings import Timeouts
from tests.proxy.harness import FAST, post_json, roster_of, run, serving
from tests.proxy.stand_ins import StandIn, running

AT_ONCE_S = 0.25


def chat(stream: bool = False) -> dict[str, Any]:
    return {"model": "tiny", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}


async def _raw_client(url: str, body: dict[str, Any]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    payload = json.dumps(body).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    writer.write(head + b"content-length: %d\r\n\r\n" % len(payload) + payload)
    await writer.drain()
    return reader, writer


async def _hang_up(writer: asyncio.StreamWriter) -> float:
    """Close the client side; the loop time it was closed."""
    writer.close()
    await writer.wait_closed()
    return asyncio.get_running_loop().time()


async def _settled(app: ProxyApp) -> None:
    for _ in range(100):
        if all(i.outstanding == 0 for i in app.roster.instances()) and app.metrics.counts.in_flight == 0:
            return
        await asyncio.sleep(0.01)


def test_a_client_gone_while_the_answer_is_generated_closes_the_backend_request_at_once() -> None:
    async def main() -> None:
        pd = StandIn("pd0", delay_s=5)
        async with running(pd):
            app = ProxyApp(roster_of({Role.PD: [pd]}), FAST)
            async with serving(app) as url:
                _, writer = await _raw_client(url, chat())
                await asyncio.sleep(0.2)
                assert pd.requests, "the request reached the backend"
                gone_at = await _hang_up(writer)
                await asyncio.wait_for(pd.disconnected.wait(), 2)
                await _settled(app)
                text = app.metrics.render(app.roster).decode()
        assert pd.disconnected_at - gone_at < AT_ONCE_S
        assert app.roster.instances()[0].outstanding == 0
        assert app.metrics.counts.in_flight == 0
        assert 'epd_proxy_requests_total{endpoint="/v1/chat/completions",status="499"} 1.0' in text

    run(main)


def test_a_client_gone_mid_stream_closes_the_stream_from_the_backend_at_once() -> None:
    async def main() -> None:
        pd = StandIn("pd0", chunks=50, chunk_delay_s=0.2)
        async with running(pd):
            app = ProxyApp(roster_of({Role.PD: [pd]}), FAST)
            async with serving(app) as url:
                reader, writer = await _raw_client(url, chat(stream=True))
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head
                assert b"pd0-0" in await reader.readuntil(b"\n\n\r\n")  # the first event's chunk
                gone_at = await _hang_up(writer)
                await asyncio.wait_for(pd.disconnected.wait(), 2)
                await _settled(app)
        assert pd.disconnected_at - gone_at < AT_ONCE_S
        assert app.roster.instances()[0].outstanding == 0

    run(main)


def test_a_client_gone_during_prefill_closes_the_prefill_request_and_never_reaches_the_decode() -> None:
    async def main() -> None:
        prefill, decode = StandIn("p0", delay_s=5), StandIn("d0")
        async with running(prefill, decode):
            app = ProxyApp(roster_of({Role.PREFILL: [prefill], Role.DECODE: [decode]}), FAST)
            async with serving(app) as url:
                _, writer = await _raw_client(url, chat())
                await asyncio.sleep(0.2)
                gone_at = await _hang_up(writer)
                await asyncio.wait_for(prefill.disconnected.wait(), 2)
                await _settled(app)
                await asyncio.sleep(0.2)
        assert prefill.disconnected_at - gone_at < AT_ONCE_S
        assert decode.requests == []
        assert all(i.outstanding == 0 for i in app.roster.instances())

    run(main)


def test_a_request_past_the_total_limit_gets_504_and_its_backend_request_is_closed() -> None:
    async def main() -> None:
        pd = StandIn("pd0", delay_s=5)
        options = replace(FAST, timeouts=Timeouts(connect=1, first_token=10, total=0.5, probe=1), limits=FAST.limits)
        async with running(pd):
            app = ProxyApp(roster_of({Role.PD: [pd]}), options)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                started = asyncio.get_running_loop().time()
                status, body = await post_json(session, url + "/v1/chat/completions", chat())
                took = asyncio.get_running_loop().time() - started
                await asyncio.wait_for(pd.disconnected.wait(), 2)
        assert status == 504 and body["error"]["type"] == "timeout", body
        assert "longer than 0.5 s" in body["error"]["message"]
        assert took < 2.0, f"the 0.5 s limit ended the request after {took:.2f} s"

    run(main)
