"""Kubernetes discovery: watch each role's EndpointSlices and keep the roster equal to the ready pods.

Scaling a role changes its EndpointSlices; the proxy follows without a restart. The Kubernetes client is an
optional extra (`epd-connectors[discovery]`) imported only here and only when discovery runs, so the library
and the static proxy need no client. The client is synchronous: one thread per role lists and watches, and
hands complete member lists to the event loop; the slice-to-instance logic is `discovery_slices`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from epd_connectors.proxy.discovery_slices import SERVICE_NAME_LABEL, RoleWatch, apply_event, specs_from_slices
from epd_connectors.proxy.roster import InstanceSpec, ProxyRole, Roster

log = logging.getLogger(__name__)
WATCH_TIMEOUT_S = 60
"""Seconds one watch call lasts before it is renewed (and the stop flag is looked at)."""
RETRY_S = 2.0
"""Seconds to wait after an API error before listing again."""

Update = tuple[ProxyRole, list[InstanceSpec]]


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
    namespace: str, watches: Sequence[RoleWatch], *, client_loader: Callable[[], Any] = load_client
) -> Callable[[Roster, Callable[[], None]], Coroutine[Any, Any, None]]:
    """A discovery coroutine function for ProxyApp: runs until cancelled. `client_loader` gives the kubernetes
    package (tests pass a stand-in with the same list/watch surface)."""

    async def run(roster: Roster, changed: Callable[[], None]) -> None:
        kubernetes = client_loader()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Update] = asyncio.Queue()
        stop = threading.Event()

        def publish(update: Update) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, update)

        threads = [
            threading.Thread(
                target=_watch_role,
                args=(kubernetes, namespace, w, publish, stop),
                daemon=True,
                name=f"epd-discovery-{w.role.value}",
            )
            for w in watches
        ]
        for thread in threads:
            thread.start()
        try:
            while True:
                role, specs = await queue.get()
                roster.replace(role, specs, healthy=True)
                log.info("%s: %d instance(s) from EndpointSlices", role.value, len(specs))
                changed()
        finally:
            stop.set()

    return run


def _watch_role(
    kubernetes: Any, namespace: str, watch: RoleWatch, publish: Callable[[Update], None], stop: threading.Event
) -> None:
    """List then watch one Service's slices until `stop`; publish the role's members after every change."""
    api = kubernetes.client.DiscoveryV1Api()
    serialize = kubernetes.client.ApiClient().sanitize_for_serialization
    selector = f"{SERVICE_NAME_LABEL}={watch.service}"
    while not stop.is_set():
        try:
            listed = api.list_namespaced_endpoint_slice(namespace, label_selector=selector)
            slices: dict[str, Mapping[str, Any]] = {}
            for item in listed.items:
                data = serialize(item)
                slices[str(data["metadata"]["name"])] = data
            publish((watch.role, specs_from_slices(slices.values(), watch)))
            stream = kubernetes.watch.Watch().stream(
                api.list_namespaced_endpoint_slice,
                namespace,
                label_selector=selector,
                resource_version=listed.metadata.resource_version,
                timeout_seconds=WATCH_TIMEOUT_S,
            )
            for event in stream:
                apply_event(slices, str(event["type"]), serialize(event["object"]))
                publish((watch.role, specs_from_slices(slices.values(), watch)))
                if stop.is_set():
                    return
        except Exception:  # API errors and expired resource versions: list again after a pause
            log.exception("watching EndpointSlices of %s/%s", namespace, watch.service)
            stop.wait(RETRY_S)
