"""Generic Kubernetes objects around a role: its workload, Service, PDB and bundle ConfigMap.

The role modules decide what goes into a pod; these functions wrap it the same way for every role, so the
selectors, labels and owner references can never differ between roles.
"""

from __future__ import annotations

from typing import Any

from epd_operator.api import constants as c
from epd_operator.render import meta
from epd_operator.render.context import Context, Unit


def _selector(ctx: Context, unit: Unit) -> dict[str, str]:
    return meta.selector_labels(ctx.owner, unit.role, unit.pool)


def render_bundle_configmap(ctx: Context, unit: Unit, bundle_json: str) -> dict[str, Any]:
    """The role's bundle.json, mounted read-only at /etc/epd."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta.metadata(ctx.owner, ctx.names.bundle_configmap(unit.name), unit.role, unit.pool),
        "data": {c.BUNDLE_FILE: bundle_json},
    }


def render_deployment(ctx: Context, unit: Unit, template: dict[str, Any], *, max_surge: int = 1) -> dict[str, Any]:
    """A Deployment. With a surge a rollout adds pods before removing old ones, so capacity never drops; without
    (GPU roles by default) one pod is replaced at a time, since GPUs are usually fully allocated and a surge pod
    would stay Pending and stall the rollout forever."""
    rolling = {"maxSurge": max_surge, "maxUnavailable": 0} if max_surge else {"maxSurge": 0, "maxUnavailable": 1}
    # An autoscaled unit's replicas are its autoscaler's alone: the apply leaves the field out.
    replicas = {} if unit.autoscaling is not None else {"replicas": unit.replicas}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta.metadata(ctx.owner, unit.name, unit.role, unit.pool),
        "spec": {
            **replicas,
            "selector": {"matchLabels": _selector(ctx, unit)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": rolling},
            "template": template,
        },
    }


def render_statefulset(ctx: Context, unit: Unit, template: dict[str, Any]) -> dict[str, Any]:
    """A StatefulSet (store clients): stable pod names under the headless Service; pods start in parallel,
    since each client registers with the master independently."""
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta.metadata(ctx.owner, unit.name, unit.role, unit.pool),
        "spec": {
            "replicas": unit.replicas,
            "serviceName": unit.name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": _selector(ctx, unit)},
            "template": template,
        },
    }


def render_daemonset(ctx: Context, unit: Unit, template: dict[str, Any]) -> dict[str, Any]:
    """A DaemonSet (store clients per node); one pod at a time is replaced, so the pool loses one segment."""
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": meta.metadata(ctx.owner, unit.name, unit.role, unit.pool),
        "spec": {
            "selector": {"matchLabels": _selector(ctx, unit)},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": template,
        },
    }


def render_service(
    ctx: Context, unit: Unit, ports: dict[str, int], *, headless: bool, service_type: str = "ClusterIP"
) -> dict[str, Any]:
    """The role's Service. Headless ones resolve to the ready pods' IPs: the proxy routes per pod and
    addresses EC consumers by IP, and a StatefulSet needs one for its pod names."""
    spec: dict[str, Any] = {
        "type": service_type,
        "selector": _selector(ctx, unit),
        "ports": [{"name": n, "port": p, "targetPort": n, "protocol": "TCP"} for n, p in ports.items()],
    }
    if headless:
        spec["clusterIP"] = "None"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta.metadata(ctx.owner, unit.name, unit.role, unit.pool),
        "spec": spec,
    }


def render_pdb(ctx: Context, unit: Unit) -> dict[str, Any]:
    """At most one pod of the role disrupted at a time (drains, upgrades). Rendered for every role that may
    run several replicas whatever the current count, so scaling never adds or removes an object."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta.metadata(ctx.owner, unit.name, unit.role, unit.pool),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": _selector(ctx, unit)}},
    }
