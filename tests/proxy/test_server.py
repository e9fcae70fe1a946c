"""The proxy's own HTTP/1.1 server over raw sockets: keep-alive, pipelining, 100-continue, chunked bodies,
limits, HEAD, HTTP/1.0, malformed input, and accepting every waiting connection on one wake-up."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import uvloop

from epd_connectors.config.roles import Role
from epd_connectors.proxy.app import ProxyApp
from epd_connectors.proxy.server import Server
from epd_connectors.proxy.settings import Clients, ProxyOptions
from tests.proxy.harness import FAST, roster_of, run, serving
from tests.proxy.stand_ins import StandIn, running

BODY = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}).encode()


def post(body: bytes = BODY, extra: bytes = b"") -> bytes:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    return head + b"content-length: %d\r\n" % len(body) + extra + b"\r\n" + body


async def answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One answer framed by content-length: its head and body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    return head, await reader.readexactly(length)


@asynccontextmanager
async def in_front_of(pd: StandIn, options: ProxyOptions = FAST) -> AsyncIterator[str]:
    """The stand-in running and the proxy served in front of it; the proxy's URL."""
    async with running(pd), serving(ProxyApp(roster_of({Role.PD: [pd]}), options)) as url:
        yield url


async def connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


def test_keep_alive_and_pipelined_requests_are_answered_in_order_on_one_connection() -> None:
    async def main() -> None:
        pd = StandIn("pd0")
        async with in_front_of(pd) as url:
            reader, writer = await connect(url)
            writer.write(post())
            first = await answer(reader)
            writer.write(post() + b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n" + post())
            rest = [await answer(reader) for _ in range(3)]
            writer.close()
        assert first[0].startswith(b"HTTP/1.1 200") and b"from pd0" in first[1]
        assert [h.split(b"\r\n")[0] for h, _ in rest] == [b"HTTP/1.1 200 OK"] * 3
        assert b"from pd0" in rest[0][1] and b"serving" in rest[1][1] and b"from pd0" in rest[2][1]
        assert len(pd.requests) == 3

    run(main)


def test_expect_100_continue_and_a_chunked_body() -> None:
    async def main() -> None:
        pd = StandIn("pd0")
        async with in_front_of(pd) as url:
            reader, writer = await connect(url)
            writer.write(post(extra=b"expect: 100-continue\r\n")[: -len(BODY)])
            assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(BODY)
            continued = await answer(reader)
            head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
            half = len(BODY) // 2
            chunks = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, BODY[:half], len(BODY) - half, BODY[half:])
            writer.write(head + chunks)
            chunked = await answer(reader)
            writer.close()
        assert continued[0].startswith(b"HTTP/1.1 200") and b"from pd0" in continued[1]
        assert chunked[0].startswith(b"HTTP/1.1 200") and b"from pd0" in chunked[1]
        assert pd.requests == [json.loads(BODY)] * 2

    run(main)


def test_a_body_over_the_limit_is_refused_before_it_is_read() -> None:
    async def main() -> None:
        pd = StandIn("pd0")
        options = replace(FAST, clients=Clients(max_body_bytes=1000))
        async with in_front_of(pd, options) as url:
            reader, writer = await connect(url)
            writer.write(post(b"x" * 5000)[:-5000])  # the head only: refused on its content-length
            refused = await answer(reader)
            closed = await reader.read()
            writer.close()
        assert refused[0].startswith(b"HTTP/1.1 413") and b"connection: close" in refused[0]
        assert "larger than 1000 bytes" in json.loads(refused[1])["error"]["message"]
        assert closed == b""
        assert pd.requests == []

    run(main)


def test_head_http10_and_malformed_requests() -> None:
    async def main() -> None:
        pd = StandIn("pd0")
        async with in_front_of(pd) as url:
            reader, writer = await connect(url)
            writer.write(b"HEAD /health HTTP/1.1\r\nhost: x\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            writer.write(b"GET /livez HTTP/1.0\r\n\r\n")
            old = await reader.read()  # HTTP/1.0 without keep-alive: answered, then closed
            writer.close()
            reader, writer = await connect(url)
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
            malformed = await reader.read()
            writer.close()
        assert head.startswith(b"HTTP/1.1 200") and b"content-length: " in head
        assert old.startswith(b"HTTP/1.1 200") and old.endswith(b'{"status":"serving"}')
        assert malformed.startswith(b"HTTP/1.1 400") and b"malformed HTTP request" in malformed

    run(main)


def test_a_stream_to_an_http10_client_is_not_chunked_and_ends_with_the_connection() -> None:
    async def main() -> None:
        pd = StandIn("pd0", chunks=3)
        async with in_front_of(pd) as url:
            reader, writer = await connect(url)
            body = json.dumps({**json.loads(BODY), "stream": True}).encode()
            writer.write(post(body).replace(b"HTTP/1.1", b"HTTP/1.0", 1))
            whole = await reader.read()
            writer.close()
        head, _, events = whole.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding" not in head, head
        assert events.startswith(b"data: ") and events.endswith(b"data: [DONE]\n\n"), events
        assert all(f"pd0-{i}".encode() in events for i in range(3))

    run(main)


def test_every_waiting_connection_is_accepted_on_one_wake_up() -> None:
    """uvloop's own listener takes one connection per loop iteration, so a burst waits behind a busy loop; the
    server drains the listen queue whenever it wakes. 300 connections complete in the kernel while the loop
    is held, then a few iterations must have taken them all."""

    async def main() -> None:
        app = ProxyApp(roster_of({Role.PD: ["http://127.0.0.1:9"]}), FAST, probe=False)
        sock = Server.listen("127.0.0.1", 0)
        server = Server(app, error_body=app.error_body, clients=Clients(max_body_bytes=1000))
        server.start(sock)
        clients = []
        try:
            for _ in range(300):  # blocking connects: the loop does not run meanwhile
                clients.append(socket.create_connection(sock.getsockname()))
            for _ in range(5):
                await asyncio.sleep(0)
            accepted = len(server.connections)
        finally:
            for client in clients:
                client.close()
            await server.stop(0.1)
        assert accepted == 300

    uvloop.run(asyncio.wait_for(main(), 30))
