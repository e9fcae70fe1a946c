"""The operator's one connection to the Kubernetes API, and the errors it raises.

Only apply, status, events and the watches talk to the API server, all through `Client.request` and
`Client.watch`, so every third-party error (aiohttp, an HTTP status) becomes one of the exception types below in
one place (`_refusal`, and the two `except` clauses around the connection); module
kubeconfig says where the server is and who we are. Bodies are plain dicts: the operator renders whole manifests
and reads only a few status fields, so typed client models would only add conversions.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote, urlencode

import aiohttp
import kopf

from epd_operator import kubeconfig

DEFAULT_TIMEOUT_S = 30.0
"""Per request. Applies and lists answer in milliseconds; 30 s only bounds a hung connection."""

DEFAULT_POOL_SIZE = 32
"""Concurrent connections to the API server; enough for every deployment reconciling at once (50 in the bench)."""

JSON = "application/json"
APPLY_PATCH = "application/apply-patch+yaml"
"""Server-side apply; JSON is YAML, so the body is sent as JSON."""
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
"""For a pod's status conditions: merged by type, so one condition changes and the kubelet's stay."""


class KubeError(Exception):
    """A request to the API server failed; `status` is the HTTP status (0 when there was no answer)."""

    retryable = False
    """Whether the same request may succeed later without anyone changing anything."""

    def __init__(self, method: str, path: str, status: int, reason: str, message: str) -> None:
        self.method, self.path, self.status, self.reason, self.message = method, path, status, reason, message
        super().__init__(f"{method} {path}: {status} {reason}: {message}")


class NotFoundError(KubeError):
    """404: the object or its collection (e.g. the CRD) does not exist."""


class ConflictError(KubeError):
    """409: a write raced with another writer (or a resourceVersion precondition failed)."""

    retryable = True


class InvalidError(KubeError):
    """400/422: the server refused the object itself (a bug in what we rendered, or an admission policy)."""


class ForbiddenError(KubeError):
    """401/403: the operator's credentials or RBAC do not allow this request."""

    retryable = True  # an administrator may fix RBAC; retrying with backoff picks that up


class NamespaceTerminatingError(ForbiddenError):
    """403 because the namespace is being deleted: nothing may be created there any more, and retrying cannot
    help (the namespace and everything in it are going)."""

    retryable = False


NAMESPACE_TERMINATING = "NamespaceTerminating"
"""The cause the API server's NamespaceLifecycle admission attaches to that 403 (details.causes[].reason)."""


class UnavailableError(KubeError):
    """No answer, a timeout, 429 or 5xx: the API server is busy or unreachable."""

    retryable = True


def _error_type(status: int, answer: Mapping[str, Any]) -> type[KubeError]:
    causes = (answer.get("details") or {}).get("causes") or []
    if status == 403 and any(isinstance(x, dict) and x.get("reason") == NAMESPACE_TERMINATING for x in causes):
        return NamespaceTerminatingError
    if status == 404:
        return NotFoundError
    if status == 409:
        return ConflictError
    if status in (400, 422):
        return InvalidError
    if status in (401, 403):
        return ForbiddenError
    if status in {0, 429} or status >= 500:
        return UnavailableError
    return KubeError


class Requester(Protocol):
    """What apply and status need of a client (a test passes an in-memory fake)."""

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str = ...,
    ) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Connection:
    """Where the API server is: a kubeconfig file (and context), or the in-cluster service account."""

    kubeconfig: str | None = None
    """Path of a kubeconfig; None means $KUBECONFIG, then the in-cluster service account, then ~/.kube/config."""
    context: str | None = None
    """The kubeconfig context; None means its current-context."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    pool_size: int = DEFAULT_POOL_SIZE


class Client:
    """An authenticated connection pool to one API server; `request` returns the decoded JSON answer."""

    def __init__(self, connection: Connection, info: kopf.ConnectionInfo) -> None:
        self._connection = connection
        self._info, self._ssl = info, info.as_ssl_context()
        self._reloading = asyncio.Lock()
        """One reload at a time: the requests that find the credentials expired together share it."""
        self._host = str(info.server).rstrip("/")
        # No proxy or .netrc from the environment (aiohttp looks both up per request, in a thread); a
        # kubeconfig's proxy-url is passed per request.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connection.pool_size),
            timeout=aiohttp.ClientTimeout(total=connection.timeout_s),
            trust_env=False,
        )

    @classmethod
    async def connect(cls, connection: Connection) -> Client:
        """A client for `connection`; raises KubeError when no configuration can be loaded."""
        return cls(connection, await _load(connection))

    async def close(self) -> None:
        await self._session.close()

    async def credentials(self) -> kopf.ConnectionInfo:
        """What this client connects with, read again once expired (a rotated token file, an exec plugin's
        token); kopf's own connection uses it too."""
        if kubeconfig.expired(self._info):
            async with self._reloading:
                if kubeconfig.expired(self._info):  # not reloaded while this request waited
                    info = await _load(self._connection)
                    self._info, self._ssl = info, info.as_ssl_context()
        return self._info

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str = JSON,
        accept: str = JSON,
    ) -> dict[str, Any]:
        """Send one request; the JSON answer, or one of our KubeError types."""
        data = None if body is None else json.dumps(body).encode()
        try:
            sent = await self._send(method, path, query, data, content_type=content_type, accept=accept)
            async with sent as response:
                raw = await response.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise UnavailableError(method, path, 0, type(exc).__name__, str(exc)) from exc
        decoded = _decode(raw)
        if response.status >= 300:
            raise _refusal(method, path, response, decoded)
        return decoded if isinstance(decoded, dict) else {"items": decoded}

    async def watch(
        self, path: str, query: Mapping[str, str], *, accept: str = JSON, idle_s: float
    ) -> AsyncIterator[dict[str, Any]]:
        """One watch request: its events, decoded, until the server ends it (or `idle_s` pass with no byte);
        KubeError as `request`. Read in chunks, not lines: aiohttp refuses a line over 128 KB."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._connection.timeout_s, sock_read=idle_s)
        try:
            async with await self._send("GET", path, query, None, accept=accept, timeout=timeout) as response:
                if response.status >= 300:
                    raise _refusal("GET", path, response, _decode(await response.read()))
                pending = bytearray()
                async for chunk in response.content.iter_any():
                    pending += chunk
                    while (end := pending.find(b"\n")) >= 0:
                        line = bytes(pending[:end])
                        del pending[: end + 1]
                        if line.strip():
                            yield json.loads(line)
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
            raise UnavailableError("WATCH", path, 0, type(exc).__name__, str(exc)) from exc

    async def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None,
        data: bytes | None,
        *,
        content_type: str = JSON,
        accept: str = JSON,
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> aiohttp.ClientResponse:
        url = self._host + path + (f"?{urlencode(query)}" if query else "")
        headers = {"Content-Type": content_type, "Accept": accept}
        info = await self.credentials()
        headers.update(info.as_http_headers())
        return await self._session.request(
            method,
            url,
            headers=headers,
            data=data,
            ssl=self._ssl,
            proxy=info.proxy_url,
            timeout=timeout or self._session.timeout,  # None would be no timeout at all
        )


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return {"message": raw[:200].decode(errors="replace")}


def _refusal(method: str, path: str, response: aiohttp.ClientResponse, decoded: Any) -> KubeError:
    """The one place an HTTP status becomes one of our errors."""
    answer = decoded if isinstance(decoded, dict) else {}
    error = _error_type(response.status, answer)
    reason = str(answer.get("reason", response.reason))
    return error(method, path, response.status, reason, str(answer.get("message", "")))


async def _load(connection: Connection) -> kopf.ConnectionInfo:
    try:
        return await asyncio.to_thread(kubeconfig.load, connection.kubeconfig, connection.context)
    except kubeconfig.ConfigError as exc:
        raise KubeError("CONFIG", connection.kubeconfig or "in-cluster", 0, "NoConfiguration", str(exc)) from exc


def collection_path(api_version: str, plural: str, namespace: str | None) -> str:
    """The REST path of a collection: /api/v1/namespaces/ns/configmaps, /apis/apps/v1/namespaces/ns/deployments."""
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{quote(namespace, safe='')}/{plural}" if namespace else f"{prefix}/{plural}"
