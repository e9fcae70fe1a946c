"""The proxy's pooled HTTP/1.1 client (epd_connectors.proxy.http1) against small raw servers on loopback.

The servers are stand-ins written for these tests, because what is checked is what real servers do only
sometimes: close an idle keep-alive connection, break a body midway, send a body in many chunks.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from epd_connectors.proxy.http1 import Pool
from tests.proxy.harness import run

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
CHUNKED = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    + b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in (b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"))
    + b"0\r\n\r\n"
)


class _Server(asyncio.Protocol):
    """Answers each request (ending in an empty line and a 2-byte body) with `answer(transport)`."""

    connections = 0

    def __init__(self, answer: Callable[[asyncio.Transport], None]) -> None:
        self.answer = answer
        self.buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        type(self).connections += 1
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if b"\r\n\r\n" in self.buffer:
            self.buffer = b""
            self.answer(self.transport)  # type: ignore[arg-type]


@asynccontextmanager
async def serving(answer: Callable[[asyncio.Transport], None]) -> AsyncIterator[tuple[str, type[_Server]]]:
    counter = type("Counted", (_Server,), {"connections": 0})
    server = await asyncio.get_running_loop().create_server(lambda: counter(answer), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1/x", counter
    finally:
        server.close()
        await server.wait_closed()


def test_keep_alive_connections_are_reused() -> None:
    async def main() -> None:
        pool = Pool(connect_timeout=1, keepalive_s=10)
        async with serving(lambda t: t.write(OK)) as (url, counter):
            for _ in range(3):
                response = await pool.request("POST", url, b"{}", {"content-type": "application/json"})
                assert (response.status, await response.read()) == (200, b"{}")
                response.release()
            await pool.close()
        assert counter.connections == 1

    run(main)


def test_a_request_on_a_connection_the_server_closed_is_sent_again_fresh() -> None:
    def answer_then_close_later(transport: asyncio.Transport) -> None:
        transport.write(OK)
        asyncio.get_running_loop().call_later(0.05, transport.close)

    async def main() -> None:
        pool = Pool(connect_timeout=1, keepalive_s=10)
        async with serving(answer_then_close_later) as (url, counter):
            first = await pool.request("GET", url)
            await first.read()
            first.release()
            await asyncio.sleep(0.2)  # the server has closed the pooled connection by now
            second = await pool.request("GET", url)
            assert (second.status, await second.read()) == (200, b"{}")
            second.release()
            await pool.close()
        assert counter.connections == 2

    run(main)


def test_chunked_bodies_arrive_whole_and_in_order() -> None:
    async def main() -> None:
        pool = Pool(connect_timeout=1, keepalive_s=10)
        async with serving(lambda t: t.write(CHUNKED)) as (url, _):
            response = await pool.request("POST", url, b"{}")
            assert response.content_type == "text/event-stream"
            assert await response.read() == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
            response.release()
            await pool.close()

    run(main)


def test_a_body_broken_midway_raises_oserror() -> None:
    def half(transport: asyncio.Transport) -> None:
        transport.write(CHUNKED[:90])
        transport.close()

    async def main() -> None:
        pool = Pool(connect_timeout=1, keepalive_s=10)
        async with serving(half) as (url, _):
            response = await pool.request("POST", url, b"{}")
            with pytest.raises(OSError):
                await response.read()
            response.release()
            await pool.close()

    run(main)


def test_nothing_listening_is_connection_refused() -> None:
    async def main() -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        pool = Pool(connect_timeout=1, keepalive_s=10)
        with pytest.raises(ConnectionRefusedError):
            await pool.request("GET", f"http://127.0.0.1:{port}/health")
        await pool.close()

    run(main)
