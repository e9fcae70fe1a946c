"""The simulated GPU nodes: what they look like, as pure data.

kwok manages any Node carrying its annotation; the Node object itself is ours to create. Each one advertises
GPUs as the NVIDIA device plugin would (nvidia.com/gpu in capacity and allocatable) and sits in a zone, so
the scheduler really packs GPUs and topology spreading has something to spread over. No taint: pods need no
toleration to land on them, exactly like on a real GPU pool without taints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from epd_testenv import components

ZONE_LABEL = "topology.kubernetes.io/zone"
GPU_RESOURCE = "nvidia.com/gpu"
SIMULATED_LABEL = "epd.testenv/simulated"
"""Label on every node we create, so tests and the demo can select exactly these."""


@dataclass(frozen=True)
class NodePool:
    """How many simulated nodes, and what each one offers."""

    count: int = 4
    """At least 4, so spreading, packing and a node failure can all be shown."""
    zones: tuple[str, ...] = ("zone-a", "zone-b")
    """Nodes are dealt round-robin over these."""
    gpus: int = 8
    """Per node, as on an 8-GPU server."""
    cpus: int = 128
    memory: str = "1Ti"
    pods: int = 110
    """The kubelet default."""
    name_prefix: str = "gpu-node"
    extra_labels: dict[str, str] = field(default_factory=dict)

    def names(self) -> list[str]:
        return [f"{self.name_prefix}-{i}" for i in range(self.count)]


def node_manifest(pool: NodePool, index: int) -> dict[str, Any]:
    """One Node; its status is kept by kwok's node-initialize stage, which copies capacity and allocatable."""
    name = pool.names()[index]
    resources = {
        "cpu": str(pool.cpus),
        "memory": pool.memory,
        "pods": str(pool.pods),
        "ephemeral-storage": "1Ti",
        GPU_RESOURCE: str(pool.gpus),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {components.KWOK_NODE_ANNOTATION: components.KWOK_NODE_ANNOTATION_VALUE},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": f"simulated-{pool.gpus}gpu",
                ZONE_LABEL: pool.zones[index % len(pool.zones)],
                "nvidia.com/gpu.present": "true",
                SIMULATED_LABEL: "true",
                **pool.extra_labels,
            },
        },
        "spec": {},
        "status": {"capacity": resources, "allocatable": dict(resources)},
    }


def manifests(pool: NodePool) -> list[dict[str, Any]]:
    return [node_manifest(pool, i) for i in range(pool.count)]


def is_ready(node: dict[str, Any]) -> bool:
    """The Ready condition is True (set by kwok's node-initialize stage)."""
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def place_on(body: dict[str, Any], selector: dict[str, str]) -> dict[str, Any]:
    """Every component of an EPDDeployment spec (a manifest's `spec`, edited in place) on nodes matching
    `selector`: the vLLM roles (encoder and decode always exist, their sections may be left out), the proxy,
    and with a store its master and clients."""
    for role in ("encoder", "decode", *(("prefill",) if "prefill" in body else ())):
        body.setdefault(role, {})["nodeSelector"] = dict(selector)
    body.setdefault("proxy", {})["nodeSelector"] = dict(selector)
    if "store" in body:
        body["store"].setdefault("master", {})["nodeSelector"] = dict(selector)
        body["store"].setdefault("clients", {})["nodeSelector"] = dict(selector)
    return body
