"""A stand-in for the Kubernetes client, only the surface discovery uses, for the in-process discovery tests.

It is not a cluster: it has DiscoveryV1Api.list_namespaced_endpoint_slice, watch.Watch().stream and
ApiClient().sanitize_for_serialization, lists scripted slices and replays scripted watch events per Service
(by the label selector), and can refuse or fail a Service's lists, which a real API server does only when
misconfigured. The cluster tier (tests/cluster/test_proxy_discovery.py) runs discovery against a real one.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

RESOURCE_VERSION = "7"


def slice_(name: str, service: str, *addresses: tuple[str, bool], port: int = 8000) -> dict[str, Any]:
    """An EndpointSlice of `service` as the API's JSON: one endpoint per (address, ready)."""
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [a], "conditions": {"ready": ready}} for a, ready in addresses],
        "ports": [{"name": "http", "port": port}],
    }


class ApiError(Exception):
    """Shaped like the client's ApiException (status, reason, body): what discovery reads of an API error."""

    def __init__(self, status: int, reason: str, message: str = "") -> None:
        super().__init__(f"({status})\nReason: {reason}\nHTTP response body: ...")
        self.status, self.reason = status, reason
        self.body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": status})


def forbidden(namespace: str, account: str) -> ApiError:
    """The API server's answer when the account's Role does not allow listing EndpointSlices."""
    return ApiError(
        403,
        "Forbidden",
        f'endpointslices.discovery.k8s.io is forbidden: User "{account}" cannot list resource "endpointslices" '
        f'in API group "discovery.k8s.io" in the namespace "{namespace}"',
    )


class StandInKubernetes:
    """Lists `listed` and then streams `events`, per Service; a Service in `failures` raises those errors from
    its first lists, one per call, before it lists normally."""

    def __init__(
        self,
        listed: Sequence[dict[str, Any]],
        events: Sequence[tuple[str, dict[str, Any]]] = (),
        failures: dict[str, list[BaseException]] | None = None,
    ) -> None:
        self.listed, self.events = list(listed), list(events)
        self.failures = {k: list(v) for k, v in (failures or {}).items()}
        self.lists: dict[str, int] = {}
        """Calls of list per Service (the watch's own calls not counted)."""
        self.done = threading.Event()
        self.client = SimpleNamespace(
            DiscoveryV1Api=lambda: SimpleNamespace(list_namespaced_endpoint_slice=self._list),
            ApiClient=lambda: SimpleNamespace(sanitize_for_serialization=lambda obj: obj),
        )
        self.watch = SimpleNamespace(Watch=lambda: SimpleNamespace(stream=self._stream))

    @staticmethod
    def _service(selector: str) -> str:
        return selector.split("=", 1)[1]

    @staticmethod
    def _of(obj: dict[str, Any]) -> str:
        return str(obj["metadata"]["labels"]["kubernetes.io/service-name"])

    def _list(self, namespace: str, label_selector: str) -> Any:
        service = self._service(label_selector)
        self.lists[service] = self.lists.get(service, 0) + 1
        pending = self.failures.get(service)
        if pending:
            raise pending.pop(0)
        items = [s for s in self.listed if self._of(s) == service]
        return SimpleNamespace(items=items, metadata=SimpleNamespace(resource_version=RESOURCE_VERSION))

    def _stream(self, func: Any, namespace: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        assert kwargs["resource_version"] == RESOURCE_VERSION
        service = self._service(kwargs["label_selector"])
        for kind, obj in self.events:
            if self._of(obj) == service:
                yield {"type": kind, "object": obj}
        self.done.wait(5)
