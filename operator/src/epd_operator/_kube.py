"""The operator's one connection to the Kubernetes API, and the errors it raises.

Only apply, status and events talk to the API server, all through `Client.request`, so every third-party
error (aiohttp, the kubernetes client, an HTTP status) becomes one of the exception types below in exactly one
place. Bodies are plain dicts: the operator renders whole manifests and reads only a few status fields, so
the typed client models would only add conversions.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote, urlencode

import aiohttp
from kubernetes.aio import client as kube_client
from kubernetes.aio import config as kube_config

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


@dataclass(frozen=True)
class Credentials:
    """Server and identity of a loaded configuration (file paths as the client library wrote them)."""

    in_cluster: bool
    """Loaded from the pod's service account (whose token file rotates)."""
    server: str
    ca_path: str | None
    insecure: bool
    certificate_path: str | None
    private_key_path: str | None
    scheme: str | None
    token: str | None


class Client:
    """An authenticated connection pool to one API server; `request` returns the decoded JSON answer."""

    def __init__(self, api: Any, timeout_s: float = DEFAULT_TIMEOUT_S, in_cluster: bool = False) -> None:
        self._api = api
        self._in_cluster = in_cluster
        self._host: str = api.configuration.host.rstrip("/")
        self._timeout_s = timeout_s

    @classmethod
    async def connect(cls, connection: Connection) -> Client:
        """A client for `connection`; raises KubeError when no configuration can be loaded."""
        configuration = kube_client.Configuration()
        configuration.connection_pool_maxsize = connection.pool_size
        # No proxy or .netrc from the environment: aiohttp looked both up, in a thread, for every request (a
        # kubeconfig's proxy-url still applies: the client passes it per request).
        configuration.client_session_kwargs = {"trust_env": False}
        path = connection.kubeconfig or os.environ.get("KUBECONFIG")
        in_cluster = path is None and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        try:
            if in_cluster:
                kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            else:
                await kube_config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=path, context=connection.context, client_configuration=configuration
                )
        except Exception as exc:  # the loaders raise ConfigException, OSError, YAML errors...
            raise KubeError("CONFIG", path or "in-cluster", 0, "NoConfiguration", str(exc)) from exc
        return cls(kube_client.ApiClient(configuration), connection.timeout_s, in_cluster)

    async def close(self) -> None:
        await self._api.close()

    def credentials(self) -> Credentials:
        """What this client authenticates with, for kopf's own connection (the same server and identity)."""
        cfg = self._api.configuration
        token = cfg.api_key.get("BearerToken") or cfg.api_key.get("authorization")
        scheme, _, value = str(token).partition(" ") if token else ("", "", "")
        return Credentials(
            in_cluster=self._in_cluster,
            server=self._host,
            ca_path=cfg.ssl_ca_cert,
            insecure=not cfg.verify_ssl,
            certificate_path=cfg.cert_file,
            private_key_path=cfg.key_file,
            scheme=scheme if value else ("Bearer" if token else None),
            token=(value or scheme) if token else None,
        )

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str = JSON,
    ) -> dict[str, Any]:
        """Send one request; the JSON answer, or one of our KubeError types."""
        url = self._host + path + (f"?{urlencode(query)}" if query else "")
        headers = {"Content-Type": content_type, "Accept": JSON}
        try:
            # call_api sends no credentials of its own: a bearer token (service account) is added here, fresh
            # from the configuration's refresh hook; client certificates live in the TLS context already.
            for auth in (await self._api.configuration.auth_settings()).values():
                headers[auth["key"]] = auth["value"]
            response = await self._api.call_api(
                method, url, header_params=headers, body=body, _request_timeout=self._timeout_s
            )
            raw = await response.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise UnavailableError(method, path, 0, type(exc).__name__, str(exc)) from exc
        status: int = response.status
        try:
            decoded = json.loads(raw) if raw else {}
        except ValueError:
            decoded = {"message": raw[:200].decode(errors="replace")}
        if status >= 300:
            answer = decoded if isinstance(decoded, dict) else {}
            error = _error_type(status, answer)
            raise error(
                method, path, status, str(answer.get("reason", response.reason)), str(answer.get("message", ""))
            )
        return decoded if isinstance(decoded, dict) else {"items": decoded}


def collection_path(api_version: str, plural: str, namespace: str | None) -> str:
    """The REST path of a collection: /api/v1/namespaces/ns/configmaps, /apis/apps/v1/namespaces/ns/deployments."""
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{quote(namespace, safe='')}/{plural}" if namespace else f"{prefix}/{plural}"
