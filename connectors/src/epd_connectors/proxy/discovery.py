"""Kubernetes discovery: watch each role's EndpointSlices and keep the roster equal to the ready pods.

Scaling a role changes its EndpointSlices; the proxy follows without a restart. The Kubernetes client is an
optional extra (`epd-connectors[discovery]`) imported only here and only when discovery runs, so the library
and the static proxy need no client. The client is synchronous: one thread per Service lists and watches, and
hands its complete member list to the event loop, which makes each role the union of its Services (prefill
pools have one each); the slice-to-instance logic is `discovery_slices`. The API refusing the proxy (its Role
or RoleBinding missing) is logged as one line that names the fix, and retried with a growing pause.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from epd_connectors.proxy.discovery_slices import (
    SERVICE_NAME_LABEL,
    RoleWatch,
    apply_event,
    model_pod_selector,
    revisions_from_pods,
    specs_from_slices,
)
from epd_connectors.proxy.roster import InstanceSpec, PodRevision, Roster

log = logging.getLogger(__name__)
WATCH_TIMEOUT_S = 60
"""Seconds one watch call lasts before it is renewed (and the stop flag is looked at)."""
RETRY_S = 2.0
"""Seconds to wait after an API error before listing again; doubled after every further failure in a row."""
RETRY_MAX_S = 30.0
"""The longest wait between attempts: at most this long after a Role is fixed, the proxy notices."""


@dataclass(frozen=True)
class Watched:
    """What a watch reads, as its log lines name it."""

    title: str
    resource: str
    verbs: str


ENDPOINT_SLICES = Watched("EndpointSlices", "endpointslices (discovery.k8s.io)", "get, list and watch")
MODEL_PODS = Watched("model pods", "pods", "list and watch")

Update = tuple[RoleWatch, list[InstanceSpec]]
"""One Service's current instances (a role may have several Services: each prefill pool has its own)."""
Revisions = dict[str, PodRevision]
"""The model pods' revisions by pod name."""


def load_client() -> Any:
    """The kubernetes package, configured in-cluster (the pod's service account) or from ~/.kube/config."""
    try:
        import kubernetes  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415 - optional extra
    except ImportError as exc:
        raise RuntimeError("Kubernetes discovery needs the client: pip install 'epd-connectors[discovery]'") from exc
    config: Any = kubernetes.config
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return kubernetes


def kubernetes_discovery(
    namespace: str,
    watches: Sequence[RoleWatch],
    *,
    deployment: str | None = None,
    client_loader: Callable[[], Any] = load_client,
) -> Callable[[Roster, Callable[[], None]], Coroutine[Any, Any, None]]:
    """A discovery coroutine function for ProxyApp: runs until cancelled. With `deployment`, it also watches
    that deployment's model pods for their revisions (Roster.revisions). `client_loader` gives the kubernetes
    package (tests pass a stand-in with the same list/watch surface)."""

    async def run(roster: Roster, changed: Callable[[], None]) -> None:
        kubernetes = client_loader()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Update | Revisions] = asyncio.Queue()
        stop = threading.Event()

        def publish(update: Update | Revisions) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, update)

        threads = [
            threading.Thread(
                target=_watch_service,
                args=(kubernetes, namespace, w, publish, stop),
                daemon=True,
                name=f"epd-discovery-{w.service}",
            )
            for w in watches
        ]
        if deployment is not None:
            threads.append(
                threading.Thread(
                    target=_watch_model_pods,
                    args=(kubernetes, namespace, deployment, publish, stop),
                    daemon=True,
                    name="epd-discovery-pods",
                )
            )
        for thread in threads:
            thread.start()
        # Each Service's last published members: a role's roster is their union, so one pool's update never
        # drops another pool's pods.
        found: dict[RoleWatch, list[InstanceSpec]] = {}
        try:
            while True:
                update = await queue.get()
                if isinstance(update, dict):
                    roster.set_revisions(update)
                    changed()
                    continue
                watch, specs = update
                found[watch] = specs
                role = watch.role
                parts = [(w, found[w]) for w in watches if w.role is role and w in found]
                members = union(specs for _, specs in parts)
                roster.replace(role, members, healthy=True)
                log.info(
                    "%s: %d instance(s) from EndpointSlices (%s)",
                    role.value,
                    len(members),
                    ", ".join(f"{w.service} {len(specs)}" for w, specs in parts),
                )
                changed()
        finally:
            stop.set()

    return run


def union(parts: Iterable[Sequence[InstanceSpec]]) -> list[InstanceSpec]:
    """One role's instances from all its Services, sorted by URL; a pod in two Services counts once, as the
    first Service gives it (the bundle's order, so the choice is stable)."""
    found: dict[str, InstanceSpec] = {}
    for specs in parts:
        for spec in specs:
            found.setdefault(spec.url, spec)
    return [found[url] for url in sorted(found)]


def _watch_service(
    kubernetes: Any, namespace: str, watch: RoleWatch, publish: Callable[[Update], None], stop: threading.Event
) -> None:
    """List then watch one Service's slices until `stop`; publish its members after every change."""
    _list_and_watch(
        kubernetes,
        kubernetes.client.DiscoveryV1Api().list_namespaced_endpoint_slice,
        namespace=namespace,
        selector=f"{SERVICE_NAME_LABEL}={watch.service}",
        publish=lambda slices: publish((watch, specs_from_slices(slices, watch))),
        failures=Failures(namespace, watch.service),
        stop=stop,
    )


def _watch_model_pods(
    kubernetes: Any, namespace: str, deployment: str, publish: Callable[[Revisions], None], stop: threading.Event
) -> None:
    """List then watch the deployment's model pods until `stop`; publish their revisions after every change."""
    _list_and_watch(
        kubernetes,
        kubernetes.client.CoreV1Api().list_namespaced_pod,
        namespace=namespace,
        selector=model_pod_selector(deployment),
        publish=lambda pods: publish(revisions_from_pods(pods)),
        failures=Failures(namespace, deployment, watched=MODEL_PODS),
        stop=stop,
    )


def _list_and_watch(
    kubernetes: Any,
    list_call: Callable[..., Any],
    *,
    namespace: str,
    selector: str,
    publish: Callable[[Iterable[Mapping[str, Any]]], None],
    failures: Failures,
    stop: threading.Event,
) -> None:
    """List, then watch, the objects `selector` picks until `stop`; publish all of them after every change."""
    serialize = kubernetes.client.ApiClient().sanitize_for_serialization
    while not stop.is_set():
        try:
            listed = list_call(namespace, label_selector=selector)
            objects: dict[str, Mapping[str, Any]] = {}
            for item in listed.items:
                data = serialize(item)
                objects[str(data["metadata"]["name"])] = data
            publish(objects.values())
            stream = kubernetes.watch.Watch().stream(
                list_call,
                namespace,
                label_selector=selector,
                resource_version=listed.metadata.resource_version,
                timeout_seconds=WATCH_TIMEOUT_S,
            )
            for event in stream:
                failures.clear()
                apply_event(objects, str(event["type"]), serialize(event["object"]))
                publish(objects.values())
                if stop.is_set():
                    return
            # Only a watch that delivered (or ran its course) ends a run of failures: a Role that allows list
            # but not watch must still back off.
            failures.clear()
        except Exception as exc:  # API errors and expired resource versions: list again after a pause
            stop.wait(failures.record(exc))


class Failures:
    """One watch's run of consecutive failures: how long to wait before the next attempt, and what to log.

    A refusal (401, 403) is a configuration fault that retrying will not fix until someone changes RBAC, so
    it gets one line that says what to change, never a traceback. Other errors get a traceback the first time
    they occur in a row and a line after that. The wait doubles from RETRY_S up to RETRY_MAX_S. An expired
    resource version (410) is routine: the first in a row lists again at once.
    """

    def __init__(self, namespace: str, service: str, *, watched: Watched = ENDPOINT_SLICES) -> None:
        self.what = f"{watched.title} of {namespace}/{service}"
        self.watched = watched
        self.namespace = namespace
        self.pause = RETRY_S
        self.last: str | None = None
        """The previous failure's identity (error_key) while failures come in a row."""

    def clear(self) -> None:
        self.pause, self.last = RETRY_S, None

    def record(self, exc: BaseException) -> float:
        """Log `exc` as this run of failures calls for; the seconds to wait before trying again."""
        key = error_key(exc)
        repeated, self.last = key == self.last, key
        status = api_status(exc)
        if status == HTTPStatus.GONE and not repeated:
            log.info("%s: the watch's resource version expired; listing again", self.what)
            return 0.0
        pause = self.pause
        self.pause = min(self.pause * 2, RETRY_MAX_S)
        if status in (HTTPStatus.UNAUTHORIZED, HTTPStatus.FORBIDDEN):
            log.warning("%s", refusal(exc, self.what, self.namespace, pause, self.watched))
        elif repeated:
            log.warning("%s: %s again; retrying in %.0f s", self.what, key, pause)
        else:
            log.exception("%s: watching failed; retrying in %.0f s", self.what, pause, exc_info=exc)
        return pause


_HEX_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_USER = re.compile(r'User "([^"]+)"')


def api_status(exc: BaseException) -> int | None:
    """The HTTP status of a Kubernetes API error (the client's ApiException and its subclasses), else None."""
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def error_key(exc: BaseException) -> str:
    """What makes two failures the same error: the type and status, or the type and message without the
    object addresses (urllib3 puts a new connection's repr into every connect error)."""
    status = api_status(exc)
    if status is not None:
        return f"{type(exc).__name__} {status} {getattr(exc, 'reason', '') or ''}".strip()
    return f"{type(exc).__name__}: {_HEX_ADDRESS.sub('', str(exc))}"[:300]


def api_message(exc: BaseException) -> str:
    """The API server's own explanation (the message of the Status in the error's body), or ""."""
    body = getattr(exc, "body", None)
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    if not isinstance(body, str):
        return ""
    try:
        status = json.loads(body)
    except ValueError:
        return ""
    message = status.get("message") if isinstance(status, dict) else None
    return message if isinstance(message, str) else ""


def refusal(exc: BaseException, what: str, namespace: str, retry_s: float, watched: Watched = ENDPOINT_SLICES) -> str:
    """One line for a 401 or 403: the status, the account (when the API names it), the API's message (JSON
    quoted: one line, unambiguous), and what to change."""
    status = api_status(exc) or HTTPStatus.FORBIDDEN
    reason = getattr(exc, "reason", None) or HTTPStatus(status).phrase
    message = api_message(exc)
    user = _USER.search(message)
    account = user.group(1) if user else "the proxy's account"
    if status == HTTPStatus.FORBIDDEN:
        fix = (
            f"the proxy's Role must allow {watched.verbs} on {watched.resource} in namespace {namespace}, and its "
            f"RoleBinding must bind that Role to {account}"
        )
    else:
        fix = (
            "the API server did not accept the proxy's credentials: check that its ServiceAccount token is "
            "mounted (automountServiceAccountToken) and valid, and that the account exists"
        )
    said = f": {json.dumps(message)}" if message else ""
    return f"{what} refused: {status} {reason} for {account}{said}. Fix: {fix}; retrying in {retry_s:.0f} s"
