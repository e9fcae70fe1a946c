"""A small pooled HTTP/1.1 client for the proxy's backend calls, on asyncio and httptools' C parser.

The proxy's own cost per request is what it adds to every request, and a general client (aiohttp) spends more
CPU per call than the rest of the proxy together. The proxy needs little of HTTP: POST or GET with a body it
already serialized, keep-alive connections to a few hosts, a response read whole or as it arrives (SSE).
Connections idle longer than `keepalive_s` are dropped before vLLM's own idle limit closes them; a request
that fails on a reused connection before any answer byte is sent once more on a fresh one. Transport errors
are plain OSErrors (ConnectionRefusedError, ConnectionResetError) for `errors.from_client_error` to map.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from urllib.parse import urlsplit

import httptools

_JSON_CONTENT_TYPE = b"content-type: application/json\r\n"


class ConnectError(ConnectionError):
    """No connection could be made in time (the address may not exist any more)."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection, one request at a time; the parser callbacks feed the current Response."""

    def __init__(self, peer: tuple[str, int]) -> None:
        self.peer = peer
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.lost: BaseException | None = None
        self.idle_since = 0.0
        self._header_name = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transport is not asyncio.Transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionResetError(f"malformed HTTP answer: {exc}"))
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or ConnectionResetError("the backend closed the connection")
        self._fail(self.lost)

    def _fail(self, exc: BaseException) -> None:
        if self.response is not None and not self.response.complete:
            self.response._failed(exc)

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        # The proxy reads one header of an answer; the others are not decoded.
        if len(name) == 12 and self.response is not None and name.lower() == b"content-type":
            self.response.content_type = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self.response is not None:
            self.response._headers_done(self.parser.get_status_code(), self.parser.should_keep_alive())

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            self.response._body(body)

    def on_message_complete(self) -> None:
        if self.response is not None:
            self.response._done()

    @property
    def usable(self) -> bool:
        return self.lost is None and self.transport is not None and not self.transport.is_closing()


class Response:
    """An answer arriving on a connection; `release` (after reading to the end) or `close` it."""

    __slots__ = (
        "_chunks",
        "_connection",
        "_error",
        "_head",
        "_keep_alive",
        "_loop",
        "_pool",
        "_waiter",
        "complete",
        "content_type",
        "received_any",
        "status",
        "url",
    )

    def __init__(self, url: str, connection: _Connection, pool: Pool, loop: asyncio.AbstractEventLoop) -> None:
        self.url = url
        self.status = 0
        self.content_type = "application/json"
        """The answer's content-type (the proxy's default when it sent none)."""
        self.complete = False
        self._connection = connection
        self._pool = pool
        self._chunks: deque[bytes] = deque()
        self._keep_alive = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._loop = loop
        self._head = loop.create_future()
        self.received_any = False

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _headers_done(self, status: int, keep_alive: bool) -> None:
        self.received_any = True
        self.status, self._keep_alive = status, keep_alive
        if not self._head.done():
            self._head.set_result(None)

    def _body(self, data: bytes) -> None:
        self._chunks.append(data)
        self._wake()

    def _done(self) -> None:
        self.complete = True
        self._wake()

    def _failed(self, exc: BaseException) -> None:
        self._error = exc
        if not self._head.done():
            self._head.set_exception(exc)
        self._wake()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (what arrived together comes as one piece: one write onward instead of one
        per SSE event); OSError when the connection breaks before the end."""
        while True:
            if len(self._chunks) == 1:
                yield self._chunks.popleft()
                continue  # more may have arrived meanwhile
            if self._chunks:
                joined = b"".join(self._chunks)
                self._chunks.clear()
                yield joined
                continue
            if self.complete:
                return
            if self._error is not None:
                raise self._error
            self._waiter = self._loop.create_future()
            await self._waiter

    async def read(self) -> bytes:
        while not self.complete:
            if self._error is not None:
                raise self._error
            self._waiter = self._loop.create_future()
            await self._waiter
        body = b"".join(self._chunks)
        self._chunks.clear()
        return body

    def release(self) -> None:
        """Give the connection back when the answer was read to its end and may be followed; else close it."""
        if self._connection.response is not self:
            return
        self._connection.response = None
        if self.complete and self._keep_alive and self._connection.usable:
            self._pool._put_back(self._connection)
        else:
            self.close()

    def close(self) -> None:
        """Drop the connection (the backend sees the client go away, and vLLM aborts the request)."""
        self._connection.response = None
        if self._connection.transport is not None:
            self._connection.transport.close()


class Pool:
    """Keep-alive connections per host:port."""

    def __init__(self, *, connect_timeout: float, keepalive_s: float) -> None:
        self._connect_timeout = connect_timeout
        self._keepalive_s = keepalive_s
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._targets: dict[str, tuple[tuple[str, int], bytes]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def _put_back(self, connection: _Connection) -> None:
        if self._closed:
            if connection.transport is not None:
                connection.transport.close()
            return
        connection.idle_since = time.monotonic()
        self._idle.setdefault(connection.peer, []).append(connection)

    def _take_idle(self, peer: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(peer)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if connection.usable and now - connection.idle_since < self._keepalive_s:
                return connection
            if connection.transport is not None:
                connection.transport.close()
        return None

    async def _connect(self, peer: tuple[str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, connection = await loop.create_connection(lambda: _Connection(peer), peer[0], peer[1])
        except TimeoutError as exc:
            raise ConnectError(f"no connection to {peer[0]}:{peer[1]} within {self._connect_timeout} s") from exc
        return connection

    def _target(self, url: str) -> tuple[tuple[str, int], bytes]:
        """Where a URL connects and its request line's target and host header, split once per URL."""
        found = self._targets.get(url)
        if found is None:
            parts = urlsplit(url)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            found = (
                (parts.hostname or "", parts.port or 80),
                f" {target} HTTP/1.1\r\nhost: {parts.netloc}\r\n".encode(),
            )
            if len(self._targets) > 4096:  # instances come and go under discovery
                self._targets.clear()
            self._targets[url] = found
        return found

    async def request(
        self,
        method: str,
        url: str,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        *,
        json: bool = False,
    ) -> Response:
        """Send the request (`json`: its body is JSON); the Response once its status and headers arrived."""
        peer, target = self._target(url)
        head = [method.encode(), target, b"content-length: %d\r\n" % len(body)]
        if json:
            head.append(_JSON_CONTENT_TYPE)
        if headers:
            for name, value in headers.items():
                head.append(f"{name}: {value}\r\n".encode("latin-1"))
        head.append(b"\r\n")
        head.append(body)
        payload = b"".join(head)
        connection = self._take_idle(peer)
        reused = connection is not None
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        while True:
            if connection is None:
                connection = await self._connect(peer)
            response = Response(url, connection, self, loop)
            connection.response = response
            assert connection.transport is not None
            connection.transport.write(payload)
            try:
                await response._head
            except OSError:
                connection.response = None
                if connection.transport is not None:
                    connection.transport.close()
                if reused and not response.received_any:
                    connection, reused = None, False  # the idle connection had died: once more, fresh
                    continue
                raise
            except BaseException:
                response.close()
                raise
            return response

    async def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for connection in idle:
                if connection.transport is not None:
                    connection.transport.close()
        self._idle.clear()
