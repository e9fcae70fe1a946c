"""The proxy's application: routes, client I/O, disconnects and error answers, served by `server.Server`.

POST /v1/chat/completions and /v1/completions run the request `flow`; GET /v1/models is answered by a
generating instance; GET /health is 200 only when every required role has a healthy instance (readiness), and
reports each transfer path's canary (`canary`); GET
/livez is 200 while the proxy serves at all (liveness: backends still loading must not get it restarted); GET
/metrics is Prometheus text. A client that disconnects has its handler cancelled by the server, which closes
the backend connections, and vLLM aborts what it was doing. Everything the client sees on failure is an
OpenAI-style error object; a stream that fails after its first byte ends with an error event.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from typing import Any

from epd_connectors.config.bundle import PROXY_LIVENESS_PATH, PROXY_READINESS_PATH
from epd_connectors.proxy import routing
from epd_connectors.proxy.backend import Backend, dumps, loads
from epd_connectors.proxy.canary import Canaries
from epd_connectors.proxy.deadlines import Deadlines
from epd_connectors.proxy.errors import (
    BackendRejectedError,
    BadRequestError,
    NoInstanceError,
    ProxyError,
    unexpected,
)
from epd_connectors.proxy.flow import Answer, ClientRequest, Flow
from epd_connectors.proxy.health import Prober
from epd_connectors.proxy.media import check_body
from epd_connectors.proxy.metrics import CONTENT_TYPE, ProxyMetrics
from epd_connectors.proxy.roster import Roster
from epd_connectors.proxy.server import Reply, Request
from epd_connectors.proxy.settings import ProxyOptions

Discovery = Callable[[Roster, Callable[[], None]], Coroutine[Any, Any, None]]
"""A coroutine that keeps the roster current (it runs until cancelled) and calls its second argument on change."""

COMPLETION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
JSON = b"application/json"
SSE = b"text/event-stream"
SSE_HEADERS = ((b"cache-control", b"no-cache"),)
log = logging.getLogger(__name__)
_ID_PREFIX = f"epd-{os.urandom(6).hex()}"
"""Request ids are this process's random prefix plus a counter: unique across proxies, and cheaper than uuid4."""
_ID_COUNTER = itertools.count()
_SAFE_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:/+=@-]{1,128}")
"""A client's request id forwarded as is: bounded, and nothing a header or log line could misread."""


class ProxyApp:
    """The handler the server calls per request. `probe=False` trusts the roster's health as given (tests of
    routing alone)."""

    def __init__(
        self, roster: Roster, options: ProxyOptions, *, discovery: Discovery | None = None, probe: bool = True
    ) -> None:
        self.roster = roster
        self.options = options
        self.metrics = ProxyMetrics()
        self.backend = Backend(options.timeouts)
        timeouts = options.timeouts
        self.deadlines = Deadlines(timeouts.total, timeouts.first_token, timeouts.prefill, options.canary.timeout_s)
        self.flow = Flow(roster, self.backend, options, self.metrics, self.deadlines)
        self.prober = Prober(roster, self.backend, options.limits, options.timeouts)
        # Canaries go through a flow of their own: no retries elsewhere (the pair is fixed), the canary's time
        # limit on each stage (so a timeout names its stage, and a decode's is not blamed on an EC pair), and
        # counters of their own (the proxy's metrics count users' requests).
        limit = options.canary.timeout_s
        canary_options = replace(
            options,
            limits=replace(options.limits, retries=0),
            timeouts=replace(timeouts, encode=limit, prefill=limit, first_token=limit),
        )
        canary_flow = Flow(roster, self.backend, canary_options, ProxyMetrics(), self.deadlines)
        self.canaries = Canaries(roster, canary_flow, options.canary)
        self._discovery = discovery
        self._discovery_task: asyncio.Task[None] | None = None
        self._probe = probe

    def __call__(self, request: Request, reply: Reply) -> Awaitable[None]:
        """The route's coroutine, returned rather than awaited: one frame fewer on every request's await chain."""
        path, method = request.path, request.method
        if path in COMPLETION_PATHS:
            if method != "POST":
                return _send_json(reply, 405, {"error": {"message": f"{path} takes POST", "code": 405}})
            return self._completion(request, reply)
        if path == PROXY_READINESS_PATH and method in ("GET", "HEAD"):
            roles = self.roster.healthy_roles()
            ok = all(roles.values())
            payload: dict[str, Any] = {
                "status": "healthy" if ok else "unhealthy",
                "roles": {r.value: v for r, v in roles.items()},
                "canaries": "on" if self._canaries_on else "off",
                "transfers": self.canaries.report(),
            }
            if self.roster.revisions:  # the model revision new requests go to (None: no whole set right now)
                payload["modelRevision"] = self.roster.routing_revision()
            return _send_json(reply, 200 if ok else 503, payload)
        if path == PROXY_LIVENESS_PATH and method in ("GET", "HEAD"):
            return _send_json(reply, 200, {"status": "serving"})
        if path == "/metrics" and method == "GET":
            return reply.send(200, CONTENT_TYPE.encode(), self.metrics.render(self.roster, self.canaries.verdicts()))
        if path == "/v1/models" and method == "GET":
            return self._models(reply)
        return _send_json(reply, 404, {"error": {"message": f"no route {method} {path}", "code": 404}})

    @staticmethod
    def error_body(status: int, message: str) -> bytes:
        """The OpenAI-style error the server answers itself with (malformed HTTP, a body too large)."""
        kind = "invalid_request_error" if status < 500 else "internal_error"
        return dumps({"error": {"message": message, "type": kind, "code": status}})

    async def startup(self) -> None:
        await self.backend.start()
        self.deadlines.start()
        if self._probe:
            await self.prober.probe_once()
            self.prober.start()
        if self._canaries_on:
            self.canaries.start()
        if self._discovery is not None:
            self._discovery_task = asyncio.create_task(self._discovery(self.roster, self.prober.wake))

    async def shutdown(self) -> None:
        if self._discovery_task is not None:
            self._discovery_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._discovery_task
        await self.canaries.stop()
        await self.prober.stop()
        await self.deadlines.stop()
        await self.backend.close()

    @property
    def _canaries_on(self) -> bool:
        """Canaries need a prober: a proxy that must not reach its instances (Limits.probing) sends none."""
        return self._probe and self.options.limits.probing and self.options.canary.on

    async def _completion(self, client: Request, reply: Reply) -> None:
        started = time.perf_counter()
        endpoint = client.path
        raw = client.body
        try:
            body = check_body(loads(raw) if raw else None, chat=endpoint.endswith("/chat/completions"))
        except ValueError:
            await self._fail(reply, endpoint, BadRequestError("the request body is not valid JSON"))
            return
        except ProxyError as error:
            await self._fail(reply, endpoint, error)
            return
        request = ClientRequest(endpoint, body, _request_id(client), raw)
        self.metrics.counts.in_flight += 1
        answer: Answer | None = None
        try:
            with self.deadlines.limit(self.options.timeouts.total):
                answer = await self.flow.run(request)
                content_type = answer.content_type.encode()
                if answer.chunks is None:
                    await reply.send(answer.status, content_type, answer.first)
                else:
                    extra = SSE_HEADERS if content_type.startswith(SSE) else ()
                    await reply.start(answer.status, content_type, extra)
                    await reply.write(answer.first)
                    async for chunk in answer.chunks:
                        await reply.write(chunk)
                    await reply.end()
            self.metrics.count_request(endpoint, str(answer.status))
        except asyncio.CancelledError:
            if reply.gone:
                # The client went away: cancelling closed every backend request made for it.
                self.metrics.count_request(endpoint, "499")
            raise
        except Exception as exc:
            await self._answer_failure(request, reply, answer, exc)
        finally:
            if answer is not None:
                answer.close()
            self.metrics.counts.in_flight -= 1
            self.metrics.observe_stage("total", time.perf_counter() - started)

    async def _answer_failure(
        self, request: ClientRequest, reply: Reply, answer: Answer | None, exc: Exception
    ) -> None:
        """The error answer, or the error event that ends a stream already under way."""
        error = exc if isinstance(exc, ProxyError) else unexpected(exc, answer.instance if answer else request.path)
        if isinstance(exc, TimeoutError):
            error = ProxyError(f"the request took longer than {self.options.timeouts.total} s")
            error.status, error.kind = 504, "timeout"
        if not reply.started:
            await self._fail(reply, request.path, error)
            return
        # Mid-stream: the status is sent; end the stream with an error event the client can read.
        self.metrics.count_request(request.path, "mid_stream_error")
        if answer is not None:
            self.metrics.backend_errors.labels(self.roster.generator_role.value, answer.instance, "mid_stream").inc()
        event = b"data: " + dumps(error.body()) + b"\n\ndata: [DONE]\n\n"
        with contextlib.suppress(Exception):
            await reply.end(event)

    async def _fail(self, reply: Reply, endpoint: str, error: ProxyError) -> None:
        self.metrics.count_request(endpoint, str(error.status))
        if isinstance(error, BackendRejectedError):
            await reply.send(error.status, JSON, error.payload)
        else:
            if error.status >= 500:
                log.warning("%s -> %d: %s", endpoint, error.status, error.message)
            await reply.send(error.status, JSON, dumps(error.body()), error.headers())

    async def _models(self, reply: Reply) -> None:
        role = self.roster.generator_role
        url = routing.least_outstanding(self.roster.candidates(role))
        try:
            if url is None:
                raise NoInstanceError(f"no healthy {role.value} instance")
            status, data = await self.backend.get(url + "/v1/models", role=role.value)
        except ProxyError as error:
            await self._fail(reply, "/v1/models", error)
            return
        await reply.send(status, JSON, data)


def _request_id(request: Request) -> str:
    """The client's x-request-id when it is a sane one (it reaches every backend's logs and headers), else ours."""
    given = request.header(b"x-request-id")
    if given is not None and _SAFE_REQUEST_ID.fullmatch(given):
        return given.decode("ascii")
    return f"{_ID_PREFIX}-{next(_ID_COUNTER)}"


async def _send_json(reply: Reply, status: int, payload: Any) -> None:
    await reply.send(status, JSON, dumps(payload))
