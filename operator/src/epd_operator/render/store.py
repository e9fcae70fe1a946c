"""The Mooncake store's objects: the master (Deployment + Service), the store clients (StatefulSet or
DaemonSet + headless Service), and the NetworkPolicies that keep other pods away from the store's ports (the
master's, the store clients', and in embedded mode the segment-holding vLLM pods').
"""

from __future__ import annotations

from typing import Any, Final

from epd_connectors.config.bundle import RoleBundle
from epd_connectors.config.mooncake import StoreMode
from epd_connectors.config.roles import VLLM_ROLES, Role
from epd_operator.api import constants as c
from epd_operator.api.store import MetricsPeerSpec, StoreSpec
from epd_operator.derive import ports, quantity
from epd_operator.render import meta, objects
from epd_operator.render.context import OFFLOAD_DIR, Context, Unit
from epd_operator.render.pod import PodParams, Probes, http_get, pod_template, tcp_socket

NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"
"""The label Kubernetes gives every namespace: its name (a NetworkPolicy selects a namespace by it)."""
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


def leader_readiness(metrics_port: int) -> dict[str, Any]:
    """An HA master is ready only while it leads and serves: every master answers /health 200, standbys too,
    so a command reads the answer (epd-launch's own master check), and the Service routes to the leader."""
    health = f"http://127.0.0.1:{metrics_port}/health"
    command = ["python", "-m", "epd_connectors.launch.readiness", health]
    return {"exec": {"command": command}, "periodSeconds": 3, "timeoutSeconds": 5, "failureThreshold": 1}


def render_master_deployment(ctx: Context, unit: Unit, store: StoreSpec, bundle_json: str) -> dict[str, Any]:
    """One master (a restarted container restores its last snapshot from the work volume; clients reconnect
    within ~1 s), or with spec.store.master.ha several: one leads, the others stand by with its metadata, Ready
    only the leader."""
    master = store.master
    res = master.resources
    probes = Probes(
        readiness=(
            leader_readiness(master.metrics_port)
            if master.ha is not None
            else http_get("/health", ports.METRICS, period_s=5, failures=3)
        ),
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
    # Two single masters must never run at once (each would hold half the keys): replace, do not surge. HA
    # masters are replaced together too: a standby is never Ready, so a rolling update would wait forever.
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


def _pods(ctx: Context, roles: list[str]) -> dict[str, Any]:
    """This deployment's pods of `roles` (a peer of an ingress rule)."""
    return {
        "podSelector": {
            "matchLabels": {c.LABEL_DEPLOYMENT: ctx.owner.name},
            "matchExpressions": [{"key": c.LABEL_ROLE, "operator": "In", "values": sorted(map(str, roles))}],
        }
    }


def _peer(peer: MetricsPeerSpec) -> dict[str, Any]:
    """A NetworkPolicy peer from the spec's selectors (both given: pods of those labels in those namespaces)."""
    selectors = {"namespaceSelector": peer.namespace_selector, "podSelector": peer.pod_selector}
    return {key: {"matchLabels": dict(labels)} for key, labels in selectors.items() if labels is not None}


def _named(*names: str) -> list[dict[str, Any]]:
    return [{"port": name, "protocol": "TCP"} for name in names]


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


def store_user_roles(bundles: dict[str, RoleBundle]) -> list[str]:
    """The roles whose pods talk to the store: every role given a Mooncake JSON, and the store clients."""
    roles = {b.role.value for b in bundles.values() if b.mooncake is not None or b.store_client is not None}
    return sorted(roles)


def segment_holder_roles(bundles: dict[str, RoleBundle]) -> list[str]:
    """The vLLM roles whose pods hold part of the pool (embedded mode: each rank contributes a segment)."""
    roles = {
        b.role.value
        for b in bundles.values()
        if b.mooncake is not None and b.mooncake.mode is StoreMode.EMBEDDED and b.mooncake.global_segment_size > 0
    }
    return sorted(roles)


def render_store_network_policies(
    ctx: Context, store: StoreSpec, bundles: dict[str, RoleBundle]
) -> list[dict[str, Any]]:
    """Ingress to every pod that holds store data or metadata, from the deployment's store users only.

    - The master: its RPC (and metadata) port and its metrics port, which is also its health and admin
      server (store users wait on /health and read /metrics for the mounted capacity; the admin API can
      change quotas), from the store users.
    - Standalone store clients: every port from the store users (the transfer engine moves data over ports it
      picks at run time, so the metrics port cannot be singled out).
    - Embedded segment holders (vLLM pods): every port from the deployment's vLLM roles (store peers read
      segments; EC and KV peers hand over), the proxy on kv-bootstrap (it asks the prefill's bootstrap server
      for the engine id), and http from anywhere (the API and vLLM's /metrics, what the role's Service
      serves), as before any policy selected these pods.
    - spec.store.metricsFrom (a scraper): the metrics port of the master and of the store clients.
    - The operator's own pods (when it runs in the cluster): the master's metrics port, where it reads the
      store's health for status.
    Kubelet probes come from the node, which policies do not filter."""
    users = store_user_roles(bundles)
    master_ports = _named(*ports.master_ports(store.master))
    scraped: list[dict[str, Any]] = []
    if store.metrics_from:
        scraped.append({"from": [_peer(p) for p in store.metrics_from], "ports": _named(ports.METRICS)})
    master_ingress = [{"from": [_pods(ctx, users)], "ports": master_ports}, *scraped]
    operator = ctx.defaults.operator_peer
    if operator is not None:
        reader = {
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: operator.namespace}},
            "podSelector": {"matchLabels": dict(operator.labels)},
        }
        master_ingress.append({"from": [reader], "ports": _named(ports.METRICS)})
    policies = [_policy(ctx, Role.MASTER, master_ingress)]
    if store.mode == "standalone":
        policies.append(_policy(ctx, Role.STORE_CLIENT, [{"from": [_pods(ctx, users)]}, *scraped]))
    for role in segment_holder_roles(bundles):  # embedded mode only, so there are no store clients
        ingress = [
            {"from": [_pods(ctx, list(VLLM_ROLES))]},
            {"from": [_pods(ctx, [Role.PROXY])], "ports": _named(ports.BOOTSTRAP)},
            {"ports": _named(ports.HTTP)},
        ]
        policies.append(_policy(ctx, role, ingress))
    return policies
