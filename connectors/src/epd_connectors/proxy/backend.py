"""Talking HTTP to vLLM instances: pooled keep-alive connections, JSON in and out, errors mapped at the edge.

Each call, and each read of an answer's body, raises only the proxy's own errors: this module is the one place
that maps the HTTP client's (`errors.from_client_error`). 5xx and unreachable instances are
`BackendUnavailableError` (retryable), 4xx `BackendRejectedError` (the client's fault, passed through). Pooled
connections are retired before vLLM's own 5 s idle limit, so a reused socket is rarely one the server has
already closed (and `http1` resends once when it was).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson

from epd_connectors.proxy.errors import BackendRejectedError, BackendUnavailableError, from_client_error
from epd_connectors.proxy.http1 import Pool, Response
from epd_connectors.proxy.settings import Timeouts

KEEPALIVE_S = 2.5
"""Seconds an idle pooled connection is kept: half of vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE default (5 s)."""


def dumps(value: Any) -> bytes:
    return orjson.dumps(value)


def loads(data: bytes | str) -> Any:
    return orjson.loads(data)


def backend_message(payload: bytes, limit: int = 500) -> str:
    """What an instance's error answer says: the message of an OpenAI-style error body (vLLM's
    ``{"error": {"message": ...}}``), otherwise the body's text; at most `limit` characters."""
    try:
        error = loads(payload).get("error")
        message = error.get("message") if isinstance(error, dict) else None
    except (orjson.JSONDecodeError, AttributeError):
        message = None
    text = message if isinstance(message, str) and message else payload.decode(errors="replace")
    return text[:limit]


class BackendResponse:
    """A 2xx answer whose body is still to come; reading it raises only the proxy's errors."""

    def __init__(self, response: Response, role: str) -> None:
        self._response, self._role = response, role
        self.url, self.status, self.content_type = response.url, response.status, response.content_type

    async def read(self) -> bytes:
        try:
            return await self._response.read()
        except Exception as exc:
            raise from_client_error(exc, self._role, self.url) from exc

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (see `http1.Response.chunks`)."""
        try:
            async for chunk in self._response.chunks():
                yield chunk
        except Exception as exc:
            raise from_client_error(exc, self._role, self.url) from exc

    def release(self) -> None:
        self._response.release()


class Backend:
    """The proxy's HTTP client; `start` in the app's lifespan, `close` at its end."""

    def __init__(self, timeouts: Timeouts) -> None:
        self._timeouts = timeouts
        self._pool: Pool | None = None

    async def start(self) -> None:
        self._pool = Pool(connect_timeout=self._timeouts.connect, keepalive_s=KEEPALIVE_S)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @property
    def pool(self) -> Pool:
        if self._pool is None:
            raise RuntimeError("Backend.start() was not awaited")
        return self._pool

    async def open(
        self, url: str, body: Mapping[str, Any] | bytes, *, role: str, headers: Mapping[str, str] | None = None
    ) -> BackendResponse:
        """POST JSON (an object, or bytes already serialized) and return the response once its headers arrived
        with a 2xx status; the caller releases it.

        5xx -> BackendUnavailableError, 4xx -> BackendRejectedError (with the backend's body), transport errors
        mapped.
        """
        try:
            payload = body if isinstance(body, bytes) else dumps(body)
            response = await self.pool.request("POST", url, payload, headers, json=True)
        except Exception as exc:
            raise from_client_error(exc, role, url) from exc
        if response.status < 400:
            return BackendResponse(response, role)
        try:
            payload = await response.read()
        except Exception as exc:
            raise from_client_error(exc, role, url) from exc
        finally:
            response.release()
        text = backend_message(payload)
        if response.status >= 500:
            raise BackendUnavailableError(f"{role} {url} answered {response.status}: {text}")
        raise BackendRejectedError(f"{role} {url} answered {response.status}: {text}", response.status, payload)

    async def post_json(
        self, url: str, body: Mapping[str, Any], *, role: str, headers: Mapping[str, str] | None = None
    ) -> Any:
        """POST JSON and return the parsed JSON answer (2xx only)."""
        response = await self.open(url, body, role=role, headers=headers)
        try:
            data = await response.read()
        finally:
            response.release()
        try:
            return loads(data)
        except orjson.JSONDecodeError as exc:
            raise BackendUnavailableError(f"{role} {url} answered with invalid JSON") from exc

    async def get(self, url: str, *, role: str) -> tuple[int, bytes]:
        """GET; the status and body, transport errors mapped."""
        try:
            response = await self.pool.request("GET", url)
            try:
                return response.status, await response.read()
            finally:
                response.release()
        except Exception as exc:
            raise from_client_error(exc, role, url) from exc
