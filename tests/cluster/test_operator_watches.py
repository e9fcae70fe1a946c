"""The operator's own watches against a real API server: a namespace created after they started, found through
a pattern by the namespace watch; the label selector applied by the server; metadata only where asked (no body
crosses); every event in order. (A namespace's streams stopping when it goes is a unit test: a namespace's
deletion waits on the controller-manager emptying it, which in `make test`'s cluster tier did not end within
120 s, after the other operator tests.)"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from kubernetes import client

from epd_operator import _kube, apply, watches
from epd_operator.api import constants as c
from epd_operator.controller import CHILD_SELECTOR
from tests.cluster.operator_fixtures import Kube

pytestmark = pytest.mark.cluster
pytest_plugins = ["tests.cluster.operator_fixtures"]

LABELS = {c.LABEL_MANAGED_BY: c.MANAGED_BY, c.LABEL_DEPLOYMENT: "demo"}


def config_map(namespace: str, name: str, labels: dict[str, str]) -> dict[str, Any]:
    meta = {"name": name, "namespace": namespace, "labels": labels}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"big": "x" * 4096}}


def deployment(namespace: str, name: str) -> dict[str, Any]:
    pod = {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "none"}]}}
    spec = {"replicas": 0, "selector": {"matchLabels": {"app": name}}, "template": pod}
    meta = {"name": name, "namespace": namespace, "labels": LABELS}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": spec}


async def until(what: str, condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:.0f} s: {what}")
        await asyncio.sleep(0.05)


def test_the_watches_follow_a_pattern_namespace_by_label_and_metadata_only_where_asked(
    kubeconfig: Any, kube: Kube, api_client: client.ApiClient
) -> None:
    namespace = f"epd-watches-{int(time.time() * 1000) % 10**8}"
    core = client.CoreV1Api(api_client)
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    got: dict[str, list[tuple[str | None, dict[str, Any]]]] = {"configmaps": [], "deployments": []}
    listed: list[str | None] = []

    def deliver(plural: str) -> watches.Deliver:
        return lambda event_type, obj: got[plural].append((event_type, obj))

    def names(plural: str) -> list[tuple[str | None, str]]:
        return [(t, o["metadata"]["name"]) for t, o in got[plural]]

    async def scenario() -> None:
        kube_client = await _kube.Client.connect(_kube.Connection(kubeconfig=str(kubeconfig)))
        sources = [
            watches.Source(kind, CHILD_SELECTOR, deliver(kind.plural), metadata_only=kind.kind == "ConfigMap")
            for kind in apply.MANAGED_KINDS
            if kind.plural in got
        ]
        following = watches.Watches(kube_client, sources, listed=listed.append, gone=lambda _: None)
        following.start([f"{namespace[:-2]}*, !other-*"], all_namespaces=False)
        try:
            await asyncio.sleep(1.0)  # the namespace watch has listed: the namespace comes as a watch event
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
            kube.request("POST", cms, config_map(namespace, "before", LABELS))
            await until("both kinds listed in the new namespace", lambda: listed == [namespace])
            await until("the first ConfigMap", lambda: names("configmaps"))
            assert names("configmaps") == [(None, "before")] or names("configmaps") == [("ADDED", "before")]
            kube.request("POST", cms, config_map(namespace, "not-ours", {"app": "else"}))
            kube.request("POST", cms, config_map(namespace, "after", LABELS))
            kube.apply(deployment(namespace, "demo-encoder"))
            kube.delete(f"{cms}/before")
            await until("the deletion", lambda: ("DELETED", "before") in names("configmaps"))
            await until("the deployment", lambda: names("deployments")[:1] == [("ADDED", "demo-encoder")])
            assert [name for _, name in names("configmaps")[:3]] == ["before", "after", "before"]
            assert [t for t, _ in names("configmaps")[1:3]] == ["ADDED", "DELETED"], (
                "in order, and never the ConfigMap without our labels"
            )
            assert all(set(o) == {"apiVersion", "kind", "metadata"} for _, o in got["configmaps"]), "metadata only"
            assert got["configmaps"][1][1]["metadata"]["managedFields"], "what a repair compares"
            assert got["deployments"][0][1]["spec"]["replicas"] == 0, "workloads whole: status reads them"
        finally:
            await following.close()
            await kube_client.close()
            core.delete_namespace(namespace)

    asyncio.run(scenario())
