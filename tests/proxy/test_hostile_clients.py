"""The proxy's server against clients that misbehave: bodies of closed connections freed at once (the proxy runs
with a high collector threshold, so a body only a reference cycle holds would stay for thousands of
connections), heads and bodies that stall answered 408, a client that connects and says nothing closed, and
connections over the limit turned away with 503."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import tracemalloc
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace

import aiohttp
import pytest

from epd_connectors.config.media import MediaAccess
from epd_connectors.config.roles import Role
from epd_connectors.proxy.app import ProxyApp
from epd_connectors.proxy.server import Server
from epd_connectors.proxy.settings import Clients
from tests.proxy.harness import FAST, data_url, post_json, roster_of, run, serving
from tests.proxy.stand_ins import StandIn, running

BODY_BYTES = 8 * 1024 * 1024
IMAGE = {"type": "image_url", "image_url": {"url": data_url("an image")}}
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"


@asynccontextmanager
async def server_for(pd: StandIn, clients: Clients) -> AsyncIterator[tuple[Server, tuple[str, int]]]:
    """The proxy in front of the stand-in, served with these client limits; the server and its address."""
    sock = Server.listen("127.0.0.1", 0)
    address = sock.getsockname()
    async with running(pd):  # the stand-in's URL is known once it runs
        app = ProxyApp(roster_of({Role.PD: [pd]}), replace(FAST, clients=clients))
        await app.startup()
        server = Server(app, error_body=app.error_body, clients=clients)
        server.start(sock)
        try:
            yield server, address
        finally:
            await server.stop(1.0)
            await app.shutdown()


async def status_of(reader: asyncio.StreamReader) -> int:
    """The status of the answer on this connection (0: closed without one)."""
    line = await reader.readline()
    return int(line.split()[1]) if line else 0


def chat_of(size: int) -> bytes:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * size}}
    return json.dumps({"model": "tiny", "messages": [{"role": "user", "content": [image]}]}).encode()


def test_the_body_of_a_closed_connection_is_freed_without_the_collector() -> None:
    """Three ways a big body's connection ends: refused as too large while it streams in (chunked), cut off by
    the client mid-body, and answered then closed. With the cycle collector off, the memory they took must come
    back once the connections are gone: a body still reachable from a closed connection fails this."""

    async def main() -> None:
        pd = StandIn("pd0")
        async with server_for(pd, Clients(max_body_bytes=2 * BODY_BYTES)) as (server, (host, port)):

            async def closed_after(send: bytes, *, read: bool) -> None:
                reader, writer = await asyncio.open_connection(host, port)
                with contextlib.suppress(ConnectionResetError):  # a refusal closes while the client still sends
                    writer.write(send)
                    if read:
                        await status_of(reader)
                    writer.close()
                    await writer.wait_closed()

            async def gone() -> None:
                while server.connections:
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.2)  # the handlers' tasks end

            piece = b"x" * (BODY_BYTES // 4)
            chunked = HEAD + b"transfer-encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (len(piece), piece) * 12
            cut_off = HEAD + b"content-length: %d\r\n\r\n" % (2 * BODY_BYTES) + b"y" * BODY_BYTES
            valid = chat_of(BODY_BYTES)
            answered = HEAD + b"content-length: %d\r\n\r\n" % len(valid) + valid
            del valid
            await closed_after(b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n", read=True)  # warm up every code path
            await gone()
            gc.collect()
            gc.disable()
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                await closed_after(chunked, read=True)
                await closed_after(cut_off, read=False)
                await closed_after(answered, read=True)
                await gone()
                pd.requests.clear()  # the stand-in's own record of the request it answered
                kept = tracemalloc.get_traced_memory()[0] - before
            finally:
                tracemalloc.stop()
                gc.enable()
            assert kept < BODY_BYTES / 4, f"{kept / 2**20:.1f} MiB still held after three closed connections"

    run(main)


def test_a_stalled_head_or_body_is_answered_408_and_a_silent_client_is_closed() -> None:
    async def main() -> None:
        pd = StandIn("pd0")
        clients = Clients(head_timeout_s=0.3, body_timeout_s=0.3)
        async with server_for(pd, clients) as (_, (host, port)):
            writers = []

            async def sent(data: bytes) -> asyncio.StreamReader:
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(data)
                writers.append(writer)  # kept open: the proxy is the one to close
                return reader

            half_head = await sent(HEAD)
            half_body = await sent(HEAD + b"content-length: 100\r\n\r\n" + b"{" * 10)
            silent = await sent(b"")
            results = await asyncio.wait_for(
                asyncio.gather(status_of(half_head), status_of(half_body), silent.read()), 5
            )
            for writer in writers:
                writer.close()
            assert list(results[:2]) == [408, 408], results
            assert results[2] == b"", "a client that never sent a byte gets no answer, only the close"
            assert not pd.requests

            # A body that keeps moving, more slowly than the limit in all but its pace, is served.
            body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}).encode()
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(HEAD + b"content-length: %d\r\n\r\n" % len(body))
            for i in range(0, len(body), 10):
                await asyncio.sleep(0.1)
                writer.write(body[i : i + 10])
            assert await status_of(reader) == 200
            writer.close()

    run(main)


def test_a_connection_over_the_limit_is_turned_away_with_503_and_the_next_one_after_a_close_is_served() -> None:
    async def main() -> None:
        pd = StandIn("pd0")
        async with server_for(pd, Clients(max_connections=3)) as (server, (host, port)):
            held = [await asyncio.open_connection(host, port) for _ in range(3)]
            while len(server.connections) < 3:
                await asyncio.sleep(0.01)
            reader, writer = await asyncio.open_connection(host, port)
            assert await status_of(reader) == 503
            await asyncio.wait_for(reader.read(), 5)  # the rest of the answer, then the proxy closes
            writer.close()
            held[0][1].close()
            while len(server.connections) > 2:
                await asyncio.sleep(0.01)
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n")
            assert await status_of(reader) == 200
            writer.close()
            for _, other in held[1:]:
                other.close()

    run(main)


def test_the_limits_are_the_proxys_flags() -> None:
    from epd_connectors.proxy.cli import build  # noqa: PLC0415 - the command line, as epd-proxy parses it

    app, *_ = build(
        ["--pd", "http://127.0.0.1:9", "--head-timeout", "3", "--body-timeout", "4", "--max-connections", "50"]
    )
    assert app.options.clients == replace(Clients(), head_timeout_s=3.0, body_timeout_s=4.0, max_connections=50)


def test_media_parts_vllm_would_refuse_or_the_deployment_does_not_fetch_never_reach_a_backend() -> None:
    """E+PD with the operator's default media access (no URL fetched, media inline): each bad part is answered
    400 naming its place, and neither the encoder nor the PD instance hears of it."""

    def chat(part: Mapping[str, object]) -> dict[str, object]:
        return {"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "?"}, part]}]}

    bad: list[Mapping[str, object]] = [
        {"type": "image_url", "image_url": {"url": None}},
        {"type": "image_url", "image_url": {"detail": "high"}},
        {"type": "image_url", "image_url": 12345},
        {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}},
        {"type": "image_url", "image_url": {"url": "ftp://images.example.com/a.png"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,%%%"}},
        {"type": "image_url", "image_url": {"url": "http://10.96.0.1/api"}},
    ]

    async def main() -> None:
        encoder, pd = StandIn("enc0", role="encoder"), StandIn("pd0")
        async with running(encoder, pd):
            roster = roster_of({Role.ENCODER: [encoder], Role.PD: [pd]})
            options = replace(FAST, media=MediaAccess(domains=()))
            async with serving(ProxyApp(roster, options)) as url, aiohttp.ClientSession() as session:
                for part in bad:
                    status, body = await post_json(session, url + "/v1/chat/completions", chat(part))
                    assert status == 400, (part, body)
                    assert body["error"]["message"].startswith("messages[0].content[1]: "), body
                status, _ = await post_json(session, url + "/v1/chat/completions", chat(IMAGE))
                assert status == 200
        assert len(encoder.requests) == 1 and len(pd.requests) == 1, "only the good request reached them"

    run(main)


@pytest.mark.parametrize(
    ("given", "forwarded"),
    [("client-42.a:b/c", True), ("x" * 129, False), ("two words", False), ("é", False), ("", False)],
)
def test_a_client_request_id_is_forwarded_only_when_it_is_short_and_plain(given: str, forwarded: bool) -> None:
    async def main() -> None:
        pd = StandIn("pd0")
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        headers = {"x-request-id": given.encode("utf-8").decode("latin-1")}
        async with (
            running(pd),
            serving(ProxyApp(roster_of({Role.PD: [pd]}), FAST)) as url,
            aiohttp.ClientSession() as session,
            session.post(url + "/v1/chat/completions", json=body, headers=headers) as response,
        ):
            assert response.status == 200
        seen = {k.lower(): v for k, v in pd.headers[0].items()}["x-request-id"]
        assert (seen == given) is forwarded and (forwarded or seen.startswith("epd-")), seen

    run(main)
