"""The proxy as a plain ASGI application with a lifespan: routes, client I/O, disconnects and error answers.

POST /v1/chat/completions and /v1/completions run the request `flow`; GET /v1/models is answered by a
generating instance; GET /health is 200 only when every required role has a healthy instance (readiness); GET
/livez is 200 while the proxy serves at all (liveness: backends still loading must not get it restarted); GET
/metrics is Prometheus text. A client that disconnects cancels the work for it, which closes the backend
connections, and vLLM aborts what it was doing. Everything the client sees on failure is an OpenAI-style error
object; a stream that fails after its first byte ends with an error event.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping
from typing import Any

from epd_connectors.config.bundle import PROXY_LIVENESS_PATH, PROXY_READINESS_PATH
from epd_connectors.proxy import routing
from epd_connectors.proxy.backend import Backend, dumps, loads
from epd_connectors.proxy.errors import (
    BackendRejectedError,
    BadRequestError,
    NoInstanceError,
    ProxyError,
    from_client_error,
)
from epd_connectors.proxy.flow import Answer, ClientRequest, Flow
from epd_connectors.proxy.health import Prober
from epd_connectors.proxy.media import check_body
from epd_connectors.proxy.metrics import CONTENT_TYPE, ProxyMetrics
from epd_connectors.proxy.roster import Roster
from epd_connectors.proxy.settings import ProxyOptions

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Discovery = Callable[[Roster, Callable[[], None]], Coroutine[Any, Any, None]]
"""A coroutine that keeps the roster current (it runs until cancelled) and calls its second argument on change."""

COMPLETION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
JSON = b"application/json"
SSE = b"text/event-stream"
log = logging.getLogger(__name__)
_ID_PREFIX = f"epd-{os.urandom(6).hex()}"
"""Request ids are this process's random prefix plus a counter: unique across proxies, and cheaper than uuid4."""
_ID_COUNTER = itertools.count()


class ProxyApp:
    """The ASGI app. `probe=False` trusts the roster's health as given (tests of routing alone)."""

    def __init__(
        self, roster: Roster, options: ProxyOptions, *, discovery: Discovery | None = None, probe: bool = True
    ) -> None:
        self.roster = roster
        self.options = options
        self.metrics = ProxyMetrics()
        self.backend = Backend(options.timeouts)
        self.flow = Flow(roster, self.backend, options, self.metrics)
        self.prober = Prober(roster, self.backend, options.limits, options.timeouts)
        self._discovery = discovery
        self._discovery_task: asyncio.Task[None] | None = None
        self._probe = probe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path in COMPLETION_PATHS:
            if method != "POST":
                await _send_json(send, 405, {"error": {"message": f"{path} takes POST", "code": 405}})
                return
            await self._completion(scope, receive, send)
        elif path == PROXY_READINESS_PATH and method in ("GET", "HEAD"):
            roles = self.roster.healthy_roles()
            ok = all(roles.values())
            payload = {"status": "healthy" if ok else "unhealthy", "roles": {r.value: v for r, v in roles.items()}}
            await _send_json(send, 200 if ok else 503, payload)
        elif path == PROXY_LIVENESS_PATH and method in ("GET", "HEAD"):
            await _send_json(send, 200, {"status": "serving"})
        elif path == "/metrics" and method == "GET":
            await _send(send, 200, CONTENT_TYPE.encode(), self.metrics.render(self.roster))
        elif path == "/v1/models" and method == "GET":
            await self._models(send)
        else:
            await _send_json(send, 404, {"error": {"message": f"no route {method} {path}", "code": 404}})

    async def startup(self) -> None:
        await self.backend.start()
        if self._probe:
            await self.prober.probe_once()
            self.prober.start()
        if self._discovery is not None:
            self._discovery_task = asyncio.create_task(self._discovery(self.roster, self.prober.wake))

    async def shutdown(self) -> None:
        if self._discovery_task is not None:
            self._discovery_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._discovery_task
        await self.prober.stop()
        await self.backend.close()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _completion(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        endpoint = scope["path"]
        try:
            raw = await _read_body(receive, self.options.limits.max_body_bytes)
        except _DisconnectedError:
            return
        except ProxyError as error:
            await self._fail(send, endpoint, error)
            return
        try:
            body = check_body(loads(raw) if raw else None, chat=endpoint.endswith("/chat/completions"))
        except ValueError:
            await self._fail(send, endpoint, BadRequestError("the request body is not valid JSON"))
            return
        except ProxyError as error:
            await self._fail(send, endpoint, error)
            return
        request = ClientRequest(endpoint, body, _request_id(scope))
        self.metrics.in_flight.inc()
        task = asyncio.current_task()
        assert task is not None
        exchange = _Exchange(send)
        watch = asyncio.create_task(_cancel_on_disconnect(receive, task, exchange))
        try:
            await self._serve(request, exchange.send)
        except asyncio.CancelledError:
            if not exchange.gone:
                raise
            # The client went away: cancelling closed every backend request made for it.
            task.uncancel()
            self.metrics.count_request(endpoint, "499")
        finally:
            watch.cancel()
            self.metrics.in_flight.dec()
            self.metrics.observe_stage("total", time.perf_counter() - started)

    async def _serve(self, request: ClientRequest, send: Send) -> None:
        answer: Answer | None = None
        started = False
        try:
            async with asyncio.timeout(self.options.timeouts.total):
                answer = await self.flow.run(request)
                content_type = answer.content_type.encode()
                await _start(send, answer.status, content_type)
                started = True
                more = answer.chunks is not None
                await send({"type": "http.response.body", "body": answer.first, "more_body": more})
                if answer.chunks is not None:
                    async for chunk in answer.chunks:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
            self.metrics.count_request(request.path, str(answer.status))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = (
                exc
                if isinstance(exc, ProxyError)
                else from_client_error(exc, "decode", answer.instance if answer else "")
            )
            if isinstance(exc, TimeoutError):
                error = ProxyError(f"the request took longer than {self.options.timeouts.total} s")
                error.status, error.kind = 504, "timeout"
            if not started:
                await self._fail(send, request.path, error)
                return
            # Mid-stream: the status is sent; end the stream with an error event the client can read.
            self.metrics.count_request(request.path, "mid_stream_error")
            if answer is not None:
                self.metrics.backend_errors.labels(
                    self.roster.generator_role.value, answer.instance, "mid_stream"
                ).inc()
            event = b"data: " + dumps(error.body()) + b"\n\ndata: [DONE]\n\n"
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": event, "more_body": False})
        finally:
            if answer is not None:
                await answer.close()

    async def _fail(self, send: Send, endpoint: str, error: ProxyError) -> None:
        self.metrics.count_request(endpoint, str(error.status))
        if isinstance(error, BackendRejectedError):
            await _send(send, error.status, JSON, error.payload)
        else:
            if error.status >= 500:
                log.warning("%s -> %d: %s", endpoint, error.status, error.message)
            await _send_json(send, error.status, error.body())

    async def _models(self, send: Send) -> None:
        role = self.roster.generator_role
        url = routing.least_outstanding(self.roster.candidates(role))
        try:
            if url is None:
                raise NoInstanceError(f"no healthy {role.value} instance")
            status, data = await self.backend.get(url + "/v1/models", role=role.value)
        except ProxyError as error:
            await self._fail(send, "/v1/models", error)
            return
        await _send(send, status, JSON, data)


class _DisconnectedError(Exception):
    """The client left before its request body arrived."""


async def _read_body(receive: Receive, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _DisconnectedError
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BadRequestError(f"the request body is larger than {limit} bytes")
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


class _Exchange:
    """One request's response side: knows whether the response is complete, because uvicorn's receive() then
    answers http.disconnect too, which must not be taken for a client that went away."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.complete = False
        self.gone = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.complete = True
        await self._send(message)


async def _cancel_on_disconnect(receive: Receive, task: asyncio.Task[Any], exchange: _Exchange) -> None:
    """Cancel the request's task when its client disconnects before the response is complete."""
    while (await receive())["type"] != "http.disconnect":
        pass
    if not exchange.complete:
        exchange.gone = True
        task.cancel()


def _request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            return str(value.decode("latin-1"))
    return f"{_ID_PREFIX}-{next(_ID_COUNTER)}"


async def _start(send: Send, status: int, content_type: bytes) -> None:
    headers = [(b"content-type", content_type)]
    if content_type.startswith(SSE):
        headers.append((b"cache-control", b"no-cache"))
    await send({"type": "http.response.start", "status": status, "headers": headers})


async def _send(send: Send, status: int, content_type: bytes, body: bytes) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_json(send: Send, status: int, payload: Any) -> None:
    await _send(send, status, JSON, dumps(payload))
