"""The proxy's own error types, and the one place where HTTP-client errors become them.

Every failure the client can see is a `ProxyError` with an HTTP status and an OpenAI-style error body, so the
app has one way to answer, and the flow decides retries on `retryable` instead of on exception classes
of the HTTP stack.
"""

from __future__ import annotations

import asyncio
import socket

from epd_connectors.proxy.http1 import ConnectError


class ProxyError(Exception):
    """A failure with the status and message the client gets."""

    status = 500
    kind = "internal_error"
    retryable = False
    """True when another instance of the same role may succeed (nothing reached the client yet)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.role_of_failure: object = None
        """Set when a nested stage failed (an encoder under a consumer attempt): the outer retry loop then
        does not blame its own instance."""

    def body(self) -> dict[str, object]:
        """The OpenAI-shaped error object."""
        return {"error": {"message": self.message, "type": self.kind, "code": self.status}}

    def headers(self) -> tuple[tuple[bytes, bytes], ...]:
        """Headers of the answer besides its content type."""
        return ()


class BadRequestError(ProxyError):
    """The request cannot be served as sent; the message says what to change."""

    status = 400
    kind = "invalid_request_error"


class MediaUnavailableError(BadRequestError):
    """A media item the request names by URL could not be loaded by any encoder tried (a host that refuses or
    fails, a file URL the encoders may not read): the request is at fault. vLLM answers 500 for these (it
    treats a refused connection as transient and has already retried the fetch itself) and 422 for a URL that
    answers 4xx; the client gets that 422 either way, with the encoder's message."""

    status = 422


RETRY_AFTER_S = 5
"""What a 503 for a role without a healthy instance tells the client to wait: a replaced pod or a restarted
engine takes longer, but a client that asks again sooner only gets another 503."""


class NoInstanceError(ProxyError):
    """No healthy instance of a role the request needs (none ready, or the last one went while it was tried)."""

    status = 503
    kind = "service_unavailable"

    def headers(self) -> tuple[tuple[bytes, bytes], ...]:
        return ((b"retry-after", b"%d" % RETRY_AFTER_S),)


class BackendUnavailableError(ProxyError):
    """An instance could not be reached, or answered 5xx before any byte went to the client."""

    status = 502
    kind = "bad_gateway"
    retryable = True

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable
        """True when no connection could be made: the instance is taken out of routing until a probe passes."""


class BackendRejectedError(ProxyError):
    """An instance answered 4xx: the request is at fault, not the instance, so it is not retried."""

    kind = "backend_rejected"

    def __init__(self, message: str, status: int, payload: bytes) -> None:
        super().__init__(message)
        self.status = status
        self.payload = payload


class StageTimeoutError(ProxyError):
    """A stage took longer than its timeout."""

    status = 504
    kind = "timeout"


def answered_5xx(error: ProxyError) -> bool:
    """True when an instance answered the request with a 5xx status, as opposed to failing on the way: the
    backend raises that BackendUnavailableError itself, with no cause, while a transport failure carries the
    exception it came from (and a refused connection is `unreachable`)."""
    return isinstance(error, BackendUnavailableError) and not error.unreachable and error.__cause__ is None


def unexpected(exc: Exception, where: str) -> ProxyError:
    """A 500 for an exception that is none of ours: the backend maps every failure of the HTTP client, so this
    is a defect of the proxy itself (or of what it was given), never retried on another instance."""
    return ProxyError(f"{where}: {type(exc).__name__}: {exc}")


def from_client_error(exc: BaseException, role: str, url: str) -> ProxyError:
    """Our error for an exception raised while talking to `url` (a `role` instance); called only by `backend`,
    the proxy's one HTTP edge."""
    if isinstance(exc, ProxyError):
        return exc
    if isinstance(exc, ConnectError | ConnectionRefusedError | socket.gaierror):
        return BackendUnavailableError(f"{role} {url} unreachable: {exc}", unreachable=True)
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return StageTimeoutError(f"{role} {url} did not answer in time")
    if isinstance(exc, OSError):
        return BackendUnavailableError(f"{role} {url} failed: {type(exc).__name__}: {exc}")
    return ProxyError(f"{role} {url}: {type(exc).__name__}: {exc}")
