"""The proxy's HTTP/1.1 server: httptools' parser on an asyncio protocol, one handler task per request.

A general ASGI server spends more CPU per request than the proxy's own work, and uvloop's listener accepts one
new connection per loop iteration (its libuv takes one per poll), so a burst of clients waits behind a busy loop
for seconds. Here the listening socket is drained at once on every wake-up, a complete answer leaves in one
write (head and body together), a stream's chunks in one writev each, and a client that goes away cancels its
handler at once. One sweep a second, not a timer per request, closes keep-alive connections idle longer than
`keepalive_s` and answers 408 to a head or body that stalls. Requests pipelined on one connection are answered in
order. A connection holds no request body once its request is parsed or the connection is gone, and nothing
ties it to itself after it closes: the proxy runs with a high collector threshold, so a body kept alive by a
reference cycle would stay for thousands of connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import httptools

from epd_connectors.proxy.settings import Clients

log = logging.getLogger(__name__)

Header = tuple[bytes, bytes]
MAX_HEAD_BYTES = 64 * 1024
"""Largest request line plus headers; more is refused (431), as the proxy never needs long heads."""
SWEEP_S = 1.0
"""Seconds between sweeps for idle and stalled connections (at most this late on the limits above)."""
BACKLOG = 2048
"""Listen queue length: a burst of new clients waits in the kernel until the next accept round."""
_REASONS = {
    200: b"OK",
    400: b"Bad Request",
    404: b"Not Found",
    405: b"Method Not Allowed",
    408: b"Request Timeout",
    413: b"Content Too Large",
    431: b"Request Header Fields Too Large",
    499: b"Client Closed Request",
    500: b"Internal Server Error",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
}
_HEAD_STARTS: dict[tuple[int, bytes], bytes] = {}


def _status_line(status: int) -> bytes:
    return b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Status"))


def _head_start(status: int, content_type: bytes) -> bytes:
    """The status line and content-type header, made once per pair (a proxy answers with a handful)."""
    start = _HEAD_STARTS.get((status, content_type))
    if start is None:
        start = _status_line(status) + b"content-type: %s\r\n" % content_type
        if len(_HEAD_STARTS) < 256:  # content types come from backends: bounded, but not by us
            _HEAD_STARTS[(status, content_type)] = start
    return start


class Request:
    """One parsed request: method, path, query, lower-case header names, the whole body."""

    __slots__ = ("body", "headers", "method", "path", "query")

    def __init__(self, method: str, path: str, query: str, headers: list[Header], body: bytes) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body

    def header(self, name: bytes) -> bytes | None:
        """The first value of a header (`name` in lower case)."""
        for key, value in self.headers:
            if key == name:
                return value
        return None


class Reply:
    """The answer side of one request: `send` a complete answer, or `start`, `write` and `end` a stream.

    `gone` is set when the client disconnected before the answer was complete (the handler is cancelled then).
    """

    __slots__ = ("_chunked", "_connection", "_head_only", "_keep_alive", "_started", "complete", "gone")

    def __init__(self, connection: _Connection, *, head_only: bool, keep_alive: bool, chunked: bool) -> None:
        self._connection = connection
        self._head_only = head_only
        self._keep_alive = keep_alive
        self._chunked = chunked
        """HTTP/1.1 client: a stream is sent chunked; an HTTP/1.0 one ends where the connection closes."""
        self._started = False
        self.complete = False
        self.gone = False

    @property
    def started(self) -> bool:
        return self._started

    def _head(self, status: int, content_type: bytes, headers: Iterable[Header], framing: bytes) -> bytes:
        parts = [_head_start(status, content_type)]
        for name, value in headers:
            parts.append(b"%s: %s\r\n" % (name, value))
        parts.append(framing)
        if not self._keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        return b"".join(parts)

    async def send(self, status: int, content_type: bytes, body: bytes, headers: Iterable[Header] = ()) -> None:
        """The whole answer in one write."""
        head = self._head(status, content_type, headers, b"content-length: %d\r\n" % len(body))
        self._started = True
        self.complete = True
        self._connection.write_last(head if self._head_only else head + body, self._keep_alive)

    async def start(self, status: int, content_type: bytes, headers: Iterable[Header] = ()) -> None:
        """The head of a streamed answer; it leaves with the first `write`."""
        self._started = True
        if not self._chunked:
            self._keep_alive = False
        framing = _CHUNKED if self._chunked else b""
        self._connection.hold(self._head(status, content_type, headers, framing))

    async def write(self, chunk: bytes) -> None:
        """One piece of a streamed answer; waits while the client reads slower than the answer comes."""
        if chunk and not self._head_only:
            await self._connection.write_chunk(chunk, chunked=self._chunked)

    async def end(self, last: bytes = b"") -> None:
        """The last piece of a streamed answer."""
        if self.complete:
            return
        self.complete = True
        if self._head_only:
            tail = b""
        elif self._chunked:
            tail = (_chunk(last) if last else b"") + b"0\r\n\r\n"
        else:
            tail = last
        self._connection.write_last(self._connection.take_held() + tail, self._keep_alive)


_CHUNKED = b"transfer-encoding: chunked\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


Handler = Callable[[Request, Reply], Awaitable[None]]
ErrorBody = Callable[[int, str], bytes]
"""How the application words an error the server answers itself (malformed HTTP, a body too large)."""


class _Exchange:
    """A request waiting for its turn, or being answered."""

    __slots__ = ("reply", "request", "task")

    def __init__(self, request: Request, reply: Reply) -> None:
        self.request = request
        self.reply = reply
        self.task: asyncio.Task[None] | None = None


class _Connection(asyncio.Protocol):
    """One client connection; the parser's callbacks build requests, each answered by the server's handler."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        """Holds this connection (its callbacks): dropped when the connection closes, so no cycle is left."""
        now = time.monotonic()
        self.idle_since: float | None = now
        """Since when no request is on its way or in progress (a new connection's counts from its accept)."""
        self.head_since: float | None = now
        """When the head now being read began (a new connection's counts from its accept, so a client that
        connects and sends nothing is closed after the head's limit, not the longer keep-alive one)."""
        self.body_since: float | None = None
        """When the body now being read last moved."""
        self._url = b""
        self._headers: list[Header] = []
        self._body: list[bytes] = []
        self._size = 0
        self._head_size = 0
        self._refused = False
        self._refusal: bytes | None = None
        """An error answer waiting for the answer in progress to finish (the connection closes after it)."""
        self._queue: deque[_Exchange] = deque()
        self._current: _Exchange | None = None
        self._held = b""
        self._paused = False
        self._drained: asyncio.Future[None] | None = None
        self._closed = False

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transport is not asyncio.Transport
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self.parser is None:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # no upgrades: the request was answered as a plain one, the rest is ignored
        except httptools.HttpParserError as exc:
            self._refuse(400, f"malformed HTTP request: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.server.connections.discard(self)
        for exchange in (self._current, *self._queue):
            if exchange is not None and not exchange.reply.complete:
                exchange.reply.gone = True
                if exchange.task is not None:
                    exchange.task.cancel()
        # The parser and the exchange in progress (through its Reply) both point back here: drop them, and
        # the body read so far, so the connection and every body it holds go as soon as its handler ends.
        self.parser = None
        self._current = None
        self._queue.clear()
        self._body = []
        self._headers = []
        self._wake_writer()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_writer()

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self.head_since is None:
            self.head_since = time.monotonic()
        self.idle_since = None
        self._url = b""
        self._headers = []
        self._body = []
        self._size = self._head_size = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._grow_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))
        self._grow_head(len(name) + len(value))

    def on_headers_complete(self) -> None:
        self.head_since = None
        if self._refused:
            return
        self.body_since = time.monotonic()
        if _content_length(self._headers) > self.server.clients.max_body_bytes:
            self._refuse(413, f"the request body is larger than {self.server.clients.max_body_bytes} bytes")
        elif _expects_continue(self._headers) and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return
        self._size += len(body)
        if self._size > self.server.clients.max_body_bytes:
            self._refuse(413, f"the request body is larger than {self.server.clients.max_body_bytes} bytes")
            return
        self.body_since = time.monotonic()
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.body_since = None
        if self._refused:
            return
        target = self._url
        if target[:1] == b"/" and b"?" not in target:
            path, query = target, b""  # the usual origin-form target: nothing to parse
        else:
            url = httptools.parse_url(target)
            path, query = url.path or b"/", url.query or b""
        parser = self.parser
        assert parser is not None  # the parser's own callback: only connection_lost drops it
        method = parser.get_method().decode("ascii")
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = []  # the request holds the body now; its pieces go
        request = Request(method, path.decode("latin-1"), query.decode("latin-1"), self._headers, body)
        keep_alive = parser.should_keep_alive() and not self.server.closing
        chunked = parser.get_http_version() != "1.0"
        exchange = _Exchange(request, Reply(self, head_only=method == "HEAD", keep_alive=keep_alive, chunked=chunked))
        if self._current is None:
            self._run(exchange)
        else:
            self._queue.append(exchange)
            if len(self._queue) > 8 and self.transport is not None:
                self.transport.pause_reading()  # a client pipelining without reading its answers

    # requests
    def _grow_head(self, size: int) -> None:
        self._head_size += size
        if self._head_size > MAX_HEAD_BYTES and not self._refused:
            self._refuse(431, f"the request head is larger than {MAX_HEAD_BYTES} bytes")

    def _refuse(self, status: int, message: str) -> None:
        """Answer an error the handler never sees and close the connection (the rest of the input is unread)."""
        if self._refused or self.transport is None:
            return
        self._refused = True
        self._body = []
        self.head_since = self.body_since = None
        body = self.server.error_body(status, message)
        head = _status_line(status) + b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
        if self._current is None:
            self.transport.write(head + b"connection: close\r\n\r\n" + body)
            self.transport.close()
        else:  # the answer in progress finishes first, then this one and the close
            self._queue.clear()
            self._refusal = head + b"connection: close\r\n\r\n" + body

    def _run(self, exchange: _Exchange) -> None:
        self._current = exchange
        exchange.task = self.loop.create_task(self._handle(exchange))

    async def _handle(self, exchange: _Exchange) -> None:
        reply = exchange.reply
        try:
            await self.server.handler(exchange.request, reply)
        except asyncio.CancelledError:
            if not reply.gone:
                raise
        except Exception:
            log.exception("unhandled error answering %s %s", exchange.request.method, exchange.request.path)
            if not reply.started:
                await reply.send(500, b"application/json", self.server.error_body(500, "internal proxy error"))
        finally:
            if not reply.complete and not reply.gone:
                self._close()  # a stream the handler left unfinished cannot be framed any more

    # writes
    def hold(self, head: bytes) -> None:
        self._held = head

    def take_held(self) -> bytes:
        held, self._held = self._held, b""
        return held

    async def write_chunk(self, chunk: bytes, *, chunked: bool) -> None:
        if self._closed or self.transport is None:
            raise ConnectionResetError("the client went away")
        held = self.take_held()
        if chunked:
            self.transport.writelines((held, b"%x\r\n" % len(chunk), chunk, b"\r\n"))
        else:
            self.transport.writelines((held, chunk))
        if self._paused:
            await self._drain()

    def write_last(self, data: bytes, keep_alive: bool) -> None:
        if self._closed or self.transport is None:
            return
        self.transport.write(data)
        self._current = None
        if self._refusal is not None:
            self.transport.write(self._refusal)
            self._close()
        elif not keep_alive:
            self._close()
        elif self._queue:
            if self.transport is not None:
                self.transport.resume_reading()
            self.loop.call_soon(self._next)
        else:
            self.idle_since = time.monotonic()

    def _next(self) -> None:
        if self._current is None and self._queue and not self._closed:
            self._run(self._queue.popleft())

    async def _drain(self) -> None:
        self._drained = self.loop.create_future()
        try:
            await self._drained
        finally:
            self._drained = None
        if self._closed:
            raise ConnectionResetError("the client went away")

    def _wake_writer(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def close_if_idle(self, now: float, keepalive_s: float) -> None:
        if self.idle_since is not None and (self.server.closing or now - self.idle_since > keepalive_s):
            self._close()

    def time_out_reads(self, now: float, clients: Clients) -> None:
        """408 to a head or body that has stalled past its limit (a connection that never sent a byte is just
        closed: there is no request to answer)."""
        if self.head_since is not None and now - self.head_since > clients.head_timeout_s:
            if self.idle_since is not None:  # not a byte of a request yet
                self._close()
            else:
                self._refuse(408, f"the request head did not arrive within {clients.head_timeout_s:g} s")
        elif self.body_since is not None and now - self.body_since > clients.body_timeout_s:
            self._refuse(408, f"the request body stalled for more than {clients.body_timeout_s:g} s")


def _content_length(headers: list[Header]) -> int:
    for name, value in headers:
        if name == b"content-length":
            with contextlib.suppress(ValueError):
                return int(value)
    return 0


def _expects_continue(headers: list[Header]) -> bool:
    return any(name == b"expect" and value.lower() == b"100-continue" for name, value in headers)


class Server:
    """Serves `handler` on a listening socket until `stop`."""

    def __init__(
        self,
        handler: Handler,
        *,
        error_body: ErrorBody,
        clients: Clients,
    ) -> None:
        self.handler = handler
        self.error_body = error_body
        self.clients = clients
        self.connections: set[_Connection] = set()
        self.closing = False
        self.loop = asyncio.get_running_loop()
        self._socket: socket.socket | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[Any]] = set()

    @staticmethod
    def listen(host: str, port: int) -> socket.socket:
        """A non-blocking listening TCP socket (IPv6 when the host is an IPv6 literal)."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        return sock

    def start(self, sock: socket.socket) -> None:
        sock.listen(BACKLOG)
        sock.setblocking(False)
        self._socket = sock
        self.loop.add_reader(sock.fileno(), self._accept_all)
        self._sweeper = self.loop.create_task(self._sweep())

    def _accept_all(self) -> None:
        """Take every connection waiting in the listen queue (at most a backlog's worth per wake-up)."""
        assert self._socket is not None
        for _ in range(BACKLOG):
            try:
                conn, _ = self._socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: the next wake-up tries again
                log.warning("accept failed: %s", exc)
                return
            if len(self.connections) + len(self._pending) >= self.clients.max_connections:
                self._turn_away(conn)
                continue
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = self.loop.create_task(self.loop.connect_accepted_socket(lambda: _Connection(self), conn))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    def _turn_away(self, conn: socket.socket) -> None:
        """One connection over the limit: a 503 it can read (best effort, never blocking), then closed."""
        message = f"the proxy has {self.clients.max_connections} client connections open, its limit; retry later"
        body = self.error_body(503, message)
        head = _status_line(503) + b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
        with contextlib.suppress(OSError):
            conn.setblocking(False)
            conn.send(head + b"connection: close\r\n\r\n" + body)
        conn.close()

    async def _sweep(self) -> None:
        clients = self.clients
        while True:
            await asyncio.sleep(SWEEP_S)
            now = time.monotonic()
            for connection in list(self.connections):
                connection.close_if_idle(now, clients.keepalive_s)
                connection.time_out_reads(now, clients)

    async def stop(self, grace_s: float) -> None:
        """Stop accepting, close idle connections, let answers in progress finish for up to `grace_s`, then
        close every connection (their handlers are cancelled)."""
        self.closing = True
        if self._socket is not None:
            self.loop.remove_reader(self._socket.fileno())
            self._socket.close()
            self._socket = None
        if self._sweeper is not None:
            self._sweeper.cancel()
        deadline = time.monotonic() + grace_s
        while True:
            now = time.monotonic()
            for connection in list(self.connections):
                connection.close_if_idle(now, self.clients.keepalive_s)
            if not self.connections or now >= deadline:
                break
            await asyncio.sleep(0.05)
        for connection in list(self.connections):
            connection._close()
        await asyncio.sleep(0)
