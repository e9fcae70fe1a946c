"""The Mooncake store's objects: the master (Deployment + Service), the store clients (StatefulSet or
DaemonSet + headless Service), and the NetworkPolicies that keep other tenants' pods away from both.
"""

from __future__ import annotations

from typing import Any, Final

from epd_operator.api import constants as c
from epd_operator.api.spec import StoreSpec
from epd_operator.derive import ports, quantity
from epd_operator.render import meta, objects
from epd_operator.render.context import OFFLOAD_DIR, Context, Unit
from epd_operator.render.pod import PodParams, Probes, http_get, pod_template, tcp_socket

MASTER_DEFAULT_REQUESTS: Final = {"cpu": "1", "memory": "2Gi"}
"""The master holds only metadata; 1 CPU and 2 GiB serve millions of keys."""
STORE_WAIT_STARTUP_FAILURES: Final = 90
"""Startup probe failures (10 s apart) a store client may take: epd-launch waits up to 600 s for the master."""


def _image(ctx: Context) -> str:
    return ctx.spec.images.mooncake or ctx.defaults.mooncake_image


def _resources(requests: dict[str, Any], limits: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def render_master_deployment(ctx: Context, unit: Unit, store: StoreSpec, bundle_json: str) -> dict[str, Any]:
    """One master (its restart loses every key, which clients survive by reconnecting within ~1 s)."""
    master = store.master
    res = master.resources
    probes = Probes(
        readiness=http_get("/health", ports.METRICS, period_s=5, failures=3),
        liveness=http_get("/health", ports.METRICS, period_s=10, failures=6),
        startup=http_get("/health", ports.METRICS, period_s=2, failures=60),
    )
    params = PodParams(
        unit=unit,
        image=_image(ctx),
        bundle_json=bundle_json,
        ports=ports.master_ports(master),
        probes=probes,
        resources=_resources(
            quantity.default_requests(res.requests, dict(MASTER_DEFAULT_REQUESTS), res.limits), dict(res.limits)
        ),
        node_selector=master.node_selector,
    )
    deployment = objects.render_deployment(ctx, unit, pod_template(ctx, params))
    # Two masters must never run at once (each would hold half the keys): replace, do not surge.
    deployment["spec"]["strategy"] = {"type": "Recreate"}
    return deployment


def render_master_service(ctx: Context, unit: Unit, store: StoreSpec) -> dict[str, Any]:
    """A ClusterIP Service: clients dial one stable address (rpc), waits and scrapers use metrics."""
    return objects.render_service(ctx, unit, ports.master_ports(store.master), headless=False)


def store_client_memory(store: StoreSpec) -> int:
    """The floor of a store client's memory: its segment, its buffer and the process overhead."""
    clients = store.clients
    return clients.segment_size + clients.local_buffer_size + quantity.STORE_CLIENT_OVERHEAD


def _client_resources(store: StoreSpec) -> dict[str, Any]:
    # Request equals limit for memory: the pool is allocated up front, and an eviction under memory
    # pressure would drop a whole segment of the store.
    res = store.clients.resources
    floor = store_client_memory(store)
    requests = {**res.requests, "memory": quantity.at_least(res.requests.get("memory"), floor)}
    limits = {**res.limits, "memory": quantity.at_least(res.limits.get("memory"), floor)}
    if quantity.memory_bytes(limits["memory"]) != quantity.memory_bytes(requests["memory"]):
        requests["memory"] = limits["memory"] = max(
            requests["memory"], limits["memory"], key=lambda q: quantity.memory_bytes(q) or 0
        )
    return {"requests": requests, "limits": limits}


def _offload_volume(store: StoreSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    offload = store.clients.offload
    if not offload.enabled:
        return [], []
    source: dict[str, Any] = (
        {"hostPath": {"path": offload.host_path, "type": "DirectoryOrCreate"}}
        if offload.host_path
        else {"emptyDir": {"sizeLimit": quantity.format_memory(offload.size_limit)}}
    )
    return [{"name": "offload", **source}], [{"name": "offload", "mountPath": OFFLOAD_DIR}]


def render_store_client_workload(ctx: Context, unit: Unit, store: StoreSpec, bundle_json: str) -> dict[str, Any]:
    """A StatefulSet of clients.replicas, or with clients.perNode a DaemonSet on clients.nodeSelector."""
    clients = store.clients
    volumes, mounts = _offload_volume(store)
    probes = Probes(
        readiness=tcp_socket(ports.RPC, period_s=5, failures=3),
        liveness=tcp_socket(ports.RPC, period_s=10, failures=6),
        startup=tcp_socket(ports.RPC, period_s=10, failures=STORE_WAIT_STARTUP_FAILURES),
    )
    params = PodParams(
        unit=unit,
        image=_image(ctx),
        bundle_json=bundle_json,
        ports=ports.store_client_ports(clients),
        probes=probes,
        resources=_client_resources(store),
        node_selector=clients.node_selector,
        volumes=volumes,
        mounts=mounts,
    )
    template = pod_template(ctx, params)
    if clients.per_node:
        return objects.render_daemonset(ctx, unit, template)
    return objects.render_statefulset(ctx, unit, template)


def render_store_client_service(ctx: Context, unit: Unit, store: StoreSpec) -> dict[str, Any]:
    return objects.render_service(ctx, unit, ports.store_client_ports(store.clients), headless=True)


def _peer(ctx: Context) -> dict[str, Any]:
    return {"podSelector": {"matchLabels": {c.LABEL_DEPLOYMENT: ctx.owner.name}}}


def _policy(ctx: Context, role: str, ingress: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta.metadata(ctx.owner, ctx.names.network_policy(role), role),
        "spec": {
            "podSelector": {"matchLabels": meta.selector_labels(ctx.owner, role)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def render_store_network_policies(ctx: Context, store: StoreSpec) -> list[dict[str, Any]]:
    """Only this deployment's pods reach the master and the store clients; anything in the namespace may
    scrape their metrics port. The store clients admit every port from the deployment's pods, because the
    transfer engine moves data over ports it picks at run time."""
    metrics_from_namespace = {"from": [{"podSelector": {}}], "ports": [{"port": ports.METRICS, "protocol": "TCP"}]}
    master_ports = [{"port": name, "protocol": "TCP"} for name in ports.master_ports(store.master)]
    policies = [_policy(ctx, c.ROLE_MASTER, [{"from": [_peer(ctx)], "ports": master_ports}, metrics_from_namespace])]
    if store.mode == "standalone":
        policies.append(_policy(ctx, c.ROLE_STORE_CLIENT, [{"from": [_peer(ctx)]}, metrics_from_namespace]))
    return policies
