"""The local control plane works like a cluster: the controllers, the scheduler and the simulated GPU nodes.

These guard the foundation every operator test stands on: GPU capacity is visible and schedulable, workload
controllers create pods, pods become Ready, and garbage collection follows owner references. Only the
apiserver the session started on loopback is ever contacted; simulated pod IPs and ClusterIPs never are.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from kubernetes import client

from epd_testenv import nodes

pytestmark = pytest.mark.cluster

T = TypeVar("T")

DEADLINE_S = 60.0
"""kwok moves pods at once, the controllers within a second or two; a minute absorbs a loaded machine."""


def eventually(what: str, probe: Callable[[], T | None], timeout: float = DEADLINE_S) -> T:
    """Poll until `probe` returns something other than None (or False); fail naming what never happened."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.2)


def gpu_deployment(name: str, gpus: int = 1) -> client.V1Deployment:
    labels = {"app": name}
    container = {
        "name": "main",
        # Never pulled: kwok only pretends to run containers.
        "image": "example.invalid/epd/noop:0",
        "resources": {
            "requests": {nodes.GPU_RESOURCE: str(gpus), "cpu": "1", "memory": "1Gi"},
            "limits": {nodes.GPU_RESOURCE: str(gpus)},
        },
    }
    return client.V1Deployment.model_validate(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
            },
        }
    )


def as_json(obj: Any) -> dict[str, Any]:
    """A typed client object as the API shows it (camelCase keys, no nulls), like `kubectl get -o json`."""
    dumped: dict[str, Any] = obj.model_dump(by_alias=True, exclude_none=True, mode="json")
    return dumped


def _items(listed: Any) -> list[dict[str, Any]]:
    return [as_json(item) for item in listed.items or []]


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions") or [] if c["type"] == kind), {})


def _owned_by(obj: dict[str, Any], owner_uid: str) -> bool:
    return any(ref["uid"] == owner_uid for ref in obj["metadata"].get("ownerReferences") or [])


def test_every_simulated_node_offers_eight_gpus_and_is_ready(api_client: client.ApiClient) -> None:
    listed = _items(client.CoreV1Api(api_client).list_node(label_selector=f"{nodes.SIMULATED_LABEL}=true"))
    assert len(listed) >= 4
    for node in listed:
        name = node["metadata"]["name"]
        assert node["status"]["capacity"][nodes.GPU_RESOURCE] == "8", name
        assert node["status"]["allocatable"][nodes.GPU_RESOURCE] == "8", name
        assert _condition(node, "Ready").get("status") == "True", name
        assert not node["spec"].get("taints"), name
    assert len({node["metadata"]["labels"][nodes.ZONE_LABEL] for node in listed}) >= 2

    # Without a renewed lease per node the controller-manager marks the nodes NotReady after ~50 s, taints
    # them and evicts their pods, which breaks any test that runs for minutes.
    coordination = client.CoordinationV1Api(api_client)

    def renewed(name: str) -> str | None:
        try:
            lease = as_json(coordination.read_namespaced_lease(name, "kube-node-lease"))
        except client.ApiException as error:
            if error.status == 404:
                return None
            raise
        renew_time: str | None = lease["spec"].get("renewTime")
        return renew_time

    for node in listed:
        name = node["metadata"]["name"]
        eventually(f"kwok keeps a lease for {name}", functools.partial(renewed, name))


def test_gpu_deployment_runs_and_is_garbage_collected(api_client: client.ApiClient, namespace: str) -> None:
    apps = client.AppsV1Api(api_client)
    core = client.CoreV1Api(api_client)
    created = as_json(apps.create_namespaced_deployment(namespace, gpu_deployment("gpu-worker")))
    name, uid = created["metadata"]["name"], created["metadata"]["uid"]

    replicaset = eventually(
        "the Deployment controller creates a ReplicaSet",
        lambda: next((rs for rs in _items(apps.list_namespaced_replica_set(namespace)) if _owned_by(rs, uid)), None),
    )

    def ready_pod() -> dict[str, Any] | None:
        for pod in _items(core.list_namespaced_pod(namespace)):
            owned = _owned_by(pod, replicaset["metadata"]["uid"])
            if owned and pod["spec"].get("nodeName") and _condition(pod, "Ready").get("status") == "True":
                return pod
        return None

    pod = eventually("the pod is scheduled to a simulated node and Ready", ready_pod)
    node = as_json(core.read_node(pod["spec"]["nodeName"]))
    assert node["metadata"]["labels"][nodes.SIMULATED_LABEL] == "true"
    assert pod["spec"]["containers"][0]["resources"]["requests"][nodes.GPU_RESOURCE] == "1"
    eventually(
        "the Deployment reports one available replica",
        lambda: as_json(apps.read_namespaced_deployment(name, namespace))["status"].get("availableReplicas") == 1,
    )

    # Background propagation: the Deployment goes at once, the garbage collector removes its dependents.
    apps.delete_namespaced_deployment(name, namespace, propagation_policy="Background")
    eventually(
        "the garbage collector removes the ReplicaSet", lambda: not _items(apps.list_namespaced_replica_set(namespace))
    )
    eventually("the pod is deleted and removed", lambda: not _items(core.list_namespaced_pod(namespace)))


def test_gpu_capacity_is_enforced_by_the_scheduler(api_client: client.ApiClient, namespace: str) -> None:
    """A pod asking for more GPUs than any node has stays Pending, the scheduler naming the GPU shortage."""
    client.AppsV1Api(api_client).create_namespaced_deployment(namespace, gpu_deployment("too-big", gpus=9))
    core = client.CoreV1Api(api_client)

    def unschedulable() -> bool:
        for pod in _items(core.list_namespaced_pod(namespace)):
            scheduled = _condition(pod, "PodScheduled")
            if scheduled.get("reason") == "Unschedulable":
                return nodes.GPU_RESOURCE in scheduled.get("message", "")
        return False

    eventually("the scheduler reports insufficient nvidia.com/gpu", unschedulable)
