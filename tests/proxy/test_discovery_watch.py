"""Discovery's list-and-watch loop keeps the roster equal to the ready pods, with a stand-in Kubernetes client.

The stand-in has the client's surface that discovery uses (DiscoveryV1Api.list_namespaced_endpoint_slice,
watch.Watch().stream, ApiClient().sanitize_for_serialization) and replays slices and watch events: no cluster
runs in this tier, and scaling events are easier to script than to cause.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from epd_connectors.proxy.app import ProxyApp
from epd_connectors.proxy.discovery import kubernetes_discovery
from epd_connectors.proxy.discovery_slices import RoleWatch
from epd_connectors.proxy.roster import ProxyRole, Roster
from tests.proxy.harness import FAST, run


def slice_(name: str, service: str, *addresses: tuple[str, bool]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [a], "conditions": {"ready": ready}} for a, ready in addresses],
        "ports": [{"name": "http", "port": 8000}],
    }


class StandInKubernetes:
    """Lists `listed` and then streams `events`, per Service (by the label selector)."""

    def __init__(self, listed: list[dict[str, Any]], events: list[tuple[str, dict[str, Any]]]) -> None:
        self.listed, self.events = listed, events
        self.done = threading.Event()
        self.client = SimpleNamespace(
            DiscoveryV1Api=lambda: SimpleNamespace(list_namespaced_endpoint_slice=self._list),
            ApiClient=lambda: SimpleNamespace(sanitize_for_serialization=lambda obj: obj),
        )
        self.watch = SimpleNamespace(Watch=lambda: SimpleNamespace(stream=self._stream))

    @staticmethod
    def _service(selector: str) -> str:
        return selector.split("=", 1)[1]

    def _list(self, namespace: str, label_selector: str) -> Any:
        service = self._service(label_selector)
        items = [s for s in self.listed if s["metadata"]["labels"]["kubernetes.io/service-name"] == service]
        return SimpleNamespace(items=items, metadata=SimpleNamespace(resource_version="7"))

    def _stream(self, func: Any, namespace: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        assert kwargs["resource_version"] == "7"
        service = self._service(kwargs["label_selector"])
        for kind, obj in self.events:
            if obj["metadata"]["labels"]["kubernetes.io/service-name"] == service:
                yield {"type": kind, "object": obj}
        self.done.wait(5)


def test_scaling_events_change_the_roster_without_a_restart() -> None:
    async def main() -> None:
        kube = StandInKubernetes(
            listed=[slice_("enc-a", "demo-encoder", ("10.0.0.1", True)), slice_("pd-a", "demo-pd", ("10.0.1.1", True))],
            events=[
                ("ADDED", slice_("pd-b", "demo-pd", ("10.0.1.2", True))),
                ("MODIFIED", slice_("pd-a", "demo-pd", ("10.0.1.1", False))),
            ],
        )
        watches = [
            RoleWatch(ProxyRole.ENCODER, "demo-encoder", port=8000),
            RoleWatch(ProxyRole.PD, "demo-pd", port=8000, ec_port=14579),
        ]
        roster = Roster.build({ProxyRole.ENCODER: [], ProxyRole.PD: []})
        discovery = kubernetes_discovery("ns", watches, client_loader=lambda: kube)
        app = ProxyApp(roster, FAST, discovery=discovery, probe=False)
        await app.startup()
        try:
            for _ in range(200):
                pd = [i.spec for i in roster.instances(ProxyRole.PD)]
                if [s.url for s in pd] == ["http://10.0.1.2:8000"] and roster.instances(ProxyRole.ENCODER):
                    break
                await asyncio.sleep(0.01)
        finally:
            kube.done.set()
            await app.shutdown()
        assert [s.ec_addresses for s in pd] == [("tcp://10.0.1.2:14579",)]
        assert [i.url for i in roster.instances(ProxyRole.ENCODER)] == ["http://10.0.0.1:8000"]
        assert roster.ready(), "discovered ready endpoints start healthy; the prober confirms them"

    run(main)
