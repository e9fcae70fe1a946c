"""The render entry point: spec -> every desired child object, the derived values and the workloads.

Reads top to bottom: derive the shared values, check what only the whole spec can tell, build and validate each
role's bundle (then all bundles together), and wrap the bundles into Kubernetes objects in apply order.
Pure: no I/O; the same input always gives byte-identical objects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from epd_connectors.config.bundle import PROXY_READINESS_PATH, RoleBundle
from epd_connectors.config.master import MasterConfig
from epd_connectors.config.mooncake import MooncakeStoreConfig
from epd_connectors.config.roles import Role
from epd_operator.api.resource import InvalidSpecError, OperatorDefaults, Owner
from epd_operator.api.spec import EPDDeploymentSpec
from epd_operator.api.status import DeploymentValues
from epd_operator.derive import ports
from epd_operator.derive.site import CLUSTER, Site
from epd_operator.render import autoscaling, bundles_store, bundles_vllm, lm, objects, proxy, rules, store, validate
from epd_operator.render.context import Context, Unit, build_context, units


class Derived(DeploymentValues):
    """What status reports (`DeploymentValues`, as they are), and what the operator itself needs of the render."""

    python_hash_seed: int
    master_health_url: str | None = None
    """The Mooncake master's /health through its Service; None without a store."""
    master_metrics_url: str | None = None
    """The master's /metrics through its Service; None without a store."""
    proxy_health_url: str | None = None
    """The proxy's /health through its Service, which reports the canaries; None without a proxy or canaries."""
    transfers_required: bool = False
    """Ready waits for TransferReady (spec.proxy.transferCheck)."""


@dataclass(frozen=True)
class RoleWorkload:
    """One workload object of a role, for status."""

    role: Role
    kind: str
    """Deployment, StatefulSet or DaemonSet."""
    name: str
    replicas: int | None
    """None for a DaemonSet, and for an autoscaled workload (its autoscaler sets them)."""
    autoscaler: str | None = None
    """The kind of the autoscaler (named as the workload) that sets its replicas: ScaledObject or
    HorizontalPodAutoscaler; None: the spec's count."""
    bounds: tuple[int, int] = (0, 0)
    """The autoscaler's (min, max) replicas."""
    ready_needed: int | None = None
    """Ready pods that make the role ready; None: every replica (HA masters: the one leader)."""

    @property
    def autoscaled(self) -> bool:
        return self.autoscaler is not None


@dataclass(frozen=True)
class Desired:
    """Every child in apply order (ConfigMaps, Services, policies, then workloads: store, encoders, LM roles,
    proxy last, then the autoscalers), the derived values and the workloads."""

    objects: list[dict[str, Any]]
    derived: Derived
    workloads: list[RoleWorkload]


def render_desired(owner: Owner, spec: EPDDeploymentSpec, defaults: OperatorDefaults, site: Site = CLUSTER) -> Desired:
    """The desired state; InvalidSpecError (one problem per line, each naming the spec field and the fix) when
    the spec cannot be deployed. `site` decides addresses and paths (derive.site): a cluster's by default, the
    local runner's loopback ports otherwise."""
    ctx = build_context(owner, spec, defaults, site)
    all_units = units(ctx)
    problems = rules.whole_spec_problems(ctx, all_units)
    if problems:
        raise InvalidSpecError(problems)
    bundles = _bundles(ctx, all_units)
    problems = validate.deployment_problems(bundles)
    if problems:
        raise InvalidSpecError(problems)
    jsons = {name: bundle.to_json() for name, bundle in bundles.items()}
    rendered = [objects.render_bundle_configmap(ctx, u, jsons[u.name]) for u in all_units]
    rendered += [_service(ctx, u) for u in all_units]
    if spec.store is not None:
        rendered += store.render_store_network_policies(ctx, spec.store, bundles)
    rendered += [objects.render_pdb(ctx, u) for u in all_units if _has_pdb(ctx, u)]
    rendered += [o for u in all_units if u.role == Role.PROXY for o in proxy.render_proxy_rbac(ctx, u)]
    workloads = [_workload(ctx, u, jsons[u.name]) for u in all_units]
    rendered += workloads
    # After the workloads: an autoscaler whose target does not exist yet only reports that it cannot scale.
    rendered += [a for u in all_units if (a := autoscaling.render_autoscaler(ctx, u)) is not None]
    master = next((b.master for b in bundles.values() if b.master is not None), None)
    endpoint = ctx.names.proxy_url(ctx.port(ctx.names.workload(Role.PROXY), ports.HTTP, spec.proxy.service.port))
    checked = spec.proxy.transfer_check.enabled and spec.proxy.replicas > 0
    return Desired(
        objects=rendered,
        derived=Derived(
            tenant_id=ctx.tenant_id,
            embedding_cache_prefix=ctx.embedding_prefix,
            kv_cache_prefix=ctx.kv_prefix,
            store_tp_size=ctx.store_tp,
            python_hash_seed=ctx.hash_seed,
            endpoint=endpoint,
            model_revision=ctx.model_revision,
            master_health_url=ctx.names.master_health_url(master) if master is not None else None,
            master_metrics_url=ctx.names.master_metrics_url(master) if master is not None else None,
            proxy_health_url=endpoint + PROXY_READINESS_PATH if checked else None,
            transfers_required=checked and spec.proxy.transfer_check.required_for_ready,
        ),
        workloads=[
            RoleWorkload(
                role=u.role,
                kind=w["kind"],
                name=u.name,
                replicas=w["spec"].get("replicas"),
                autoscaler=autoscaling.autoscaler_kind(u.autoscaling),
                bounds=(u.autoscaling.min_replicas, u.autoscaling.max_replicas) if u.autoscaling else (0, 0),
                ready_needed=1 if u.role == Role.MASTER and spec.store and spec.store.master.ha else None,
            )
            for u, w in zip(all_units, workloads, strict=True)
        ],
    )


def _bundles(ctx: Context, all_units: list[Unit]) -> dict[str, RoleBundle]:
    """Every role's validated bundle, keyed by workload name; all problems at once."""
    master: MasterConfig | None = None
    store_json: MooncakeStoreConfig | None = None
    if ctx.spec.store is not None:
        master = validate.guarded("spec.store.master", lambda: bundles_store.master_config(ctx))
        store_json = validate.guarded("spec.store", lambda: bundles_store.requester_config(ctx, master))

    def build(unit: Unit) -> RoleBundle:
        if unit.role == Role.MASTER and master is not None:
            return bundles_store.master_bundle(ctx, master)
        if unit.role == Role.STORE_CLIENT and master is not None:
            return bundles_store.store_client_bundle(ctx, master)
        if unit.role == Role.PROXY:
            return proxy.proxy_bundle(ctx, all_units)
        return bundles_vllm.vllm_bundle(ctx, unit, master, store_json)

    def checked(unit: Unit) -> Callable[[], RoleBundle]:
        return lambda: validate.guarded(unit.spec_path, lambda: build(unit))

    built, problems = validate.collect([(u.name, checked(u)) for u in all_units])
    if problems:
        raise InvalidSpecError(list(dict.fromkeys(problems)))
    return built


def _service(ctx: Context, unit: Unit) -> dict[str, Any]:
    store_spec = ctx.spec.store
    if unit.role == Role.MASTER and store_spec is not None:
        return store.render_master_service(ctx, unit, store_spec)
    if unit.role == Role.STORE_CLIENT and store_spec is not None:
        return store.render_store_client_service(ctx, unit, store_spec)
    if unit.role == Role.PROXY:
        return proxy.render_proxy_service(ctx, unit)
    return lm.render_vllm_service(ctx, unit)


def _workload(ctx: Context, unit: Unit, bundle_json: str) -> dict[str, Any]:
    store_spec = ctx.spec.store
    if unit.role == Role.MASTER and store_spec is not None:
        return store.render_master_deployment(ctx, unit, store_spec, bundle_json)
    if unit.role == Role.STORE_CLIENT and store_spec is not None:
        return store.render_store_client_workload(ctx, unit, store_spec, bundle_json)
    if unit.role == Role.PROXY:
        return proxy.render_proxy_deployment(ctx, unit, bundle_json)
    return lm.render_vllm_deployment(ctx, unit, bundle_json)


def _has_pdb(ctx: Context, unit: Unit) -> bool:
    """Every role that may run several replicas; not the single master, not a DaemonSet (drains skip it)."""
    return unit.role != Role.MASTER and unit.replicas is not None
