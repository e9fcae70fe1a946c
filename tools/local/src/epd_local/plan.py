"""From an EPDDeployment manifest to the instances the local runner starts: pure, no processes, no sockets.

The manifest goes through the local profile, then through the operator's own `render_desired` on a loopback site
(derive.site.LocalNetwork), and each role's bundle is read back out of its rendered ConfigMap, the same JSON a
pod would mount. Nothing here rewrites a bundle: every address in it was decided by the site while rendering.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from epd_connectors.config.base import ConfigError
from epd_connectors.config.bundle import RoleBundle, parse_bundle
from epd_connectors.config.roles import Role
from epd_local.profile import LocalProfile, apply_profile
from epd_operator.api import constants as c
from epd_operator.api.resource import InvalidSpecError, OperatorDefaults, Owner, parse_spec
from epd_operator.api.spec import EPDDeploymentSpec
from epd_operator.derive.names import Names
from epd_operator.derive.site import LOOPBACK, LocalNetwork, Paths, Site
from epd_operator.render import render_desired

LOCAL_UID = "00000000-0000-4000-8000-00000000c0de"
"""The owner uid of a local rendering (only ownerReferences carry it, and nothing reads them locally)."""
POD_IP = LOOPBACK
"""What epd-launch puts where a bundle says POD_IP_PLACEHOLDER (a store client's host, an EC consumer's ec_ip)."""


class LocalPlanError(ConfigError):
    """The manifest cannot run locally; ``problems`` holds one line each (field, problem, fix)."""


@dataclass(frozen=True)
class Readiness:
    """How the runner knows an instance is up: an HTTP URL answering 200, or a TCP port accepting."""

    url: str | None = None
    tcp: tuple[str, int] | None = None

    def describe(self) -> str:
        return self.url if self.url else f"tcp://{self.tcp[0]}:{self.tcp[1]}" if self.tcp else "-"


@dataclass(frozen=True)
class Instance:
    """One process: a role's workload with its rendered bundle."""

    name: str
    """The workload name ("<deployment>-<role>[-<pool>]"); names its folder and log."""
    role: Role
    bundle: RoleBundle
    bundle_json: str
    """Exactly the rendered ConfigMap's bundle.json."""
    ready: Readiness
    ports: dict[str, int] = field(default_factory=dict)
    """Port name -> port, from the site's plan."""
    rpc_dir: str | None = None
    """A vLLM role's own VLLM_RPC_BASE_PATH (see `rpc_dir`); None for the other roles."""


@dataclass(frozen=True)
class LocalPlan:
    deployment: str
    instances: list[Instance]
    """In the operator's apply order: store, encoders, language-model roles, proxy last."""
    endpoint: str
    """The proxy's URL (render's Derived.endpoint on this site)."""
    served_model: str
    profile_changes: list[str]
    paths: Paths


def load_manifest(path: Path) -> tuple[Owner, EPDDeploymentSpec]:
    """The owner and typed spec of an EPDDeployment YAML; LocalPlanError with one line per problem."""
    try:
        doc: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise LocalPlanError([f"{path}: cannot read an EPDDeployment ({exc})"]) from exc
    if not isinstance(doc, dict) or doc.get("kind") != c.KIND or not isinstance(doc.get("spec"), dict):
        raise LocalPlanError([f"{path}: not an {c.KIND} manifest (kind: {c.KIND}, with a spec)"])
    meta = doc.get("metadata") or {}
    owner = Owner(name=str(meta.get("name", "local")), namespace=str(meta.get("namespace", "default")), uid=LOCAL_UID)
    try:
        return owner, parse_spec(doc["spec"])
    except InvalidSpecError as exc:
        raise LocalPlanError(exc.problems) from exc


def local_paths(workdir: Path, model_dir: Path) -> Paths:
    """The pod mounts as folders: the model where it is, the shared volume and work folders under `workdir`."""
    return Paths(
        model_dir=str(model_dir),
        shared_dir=str(workdir / "shared"),
        work_dir=str(workdir / "work"),
        offload_dir=str(workdir / "offload"),
    )


def plan_local(
    owner: Owner,
    spec: EPDDeploymentSpec,
    *,
    paths: Paths,
    profile: LocalProfile,
    base_port: int,
    taken: frozenset[int] = frozenset(),
) -> LocalPlan:
    """Every instance of the deployment, rendered on a loopback site whose ports start at `base_port`."""
    spec, changes = apply_profile(spec, profile)
    network = LocalNetwork(base_port=base_port, taken=taken)
    try:
        desired = render_desired(owner, spec, OperatorDefaults(), Site(network=network, paths=paths))
    except InvalidSpecError as exc:
        raise LocalPlanError(exc.problems) from exc
    names = Names(owner.name, owner.namespace)
    configmaps = {o["metadata"]["name"]: o for o in desired.objects if o["kind"] == "ConfigMap"}
    problems: list[str] = []
    instances: list[Instance] = []
    for workload in desired.workloads:
        if workload.replicas == 0:
            continue
        if workload.replicas is not None and workload.replicas > 1:
            fix = "remove spec.store.master.ha" if workload.role is Role.MASTER else "set its replicas to 1"
            problems.append(
                f"{workload.name}: replicas = {workload.replicas}; the local runner starts one instance per role "
                f"(each role's ports come from its workload). Fix: {fix} for a local run"
            )
            continue
        text = configmaps[names.bundle_configmap(workload.name)]["data"][c.BUNDLE_FILE]
        bundle = parse_bundle(text, source=workload.name)
        own = {name: port for (unit, name), port in network.assigned.items() if unit == workload.name}
        rpc = rpc_dir(bundle.vllm.port) if bundle.vllm is not None else None
        instances.append(Instance(workload.name, bundle.role, bundle, text, readiness(bundle), own, rpc))
    if problems:
        raise LocalPlanError(problems)
    return LocalPlan(
        deployment=owner.name,
        instances=instances,
        endpoint=desired.derived.endpoint,
        served_model=spec.model.served_model_name or spec.model.name,
        profile_changes=changes,
        paths=paths,
    )


RPC_ROOT = "/tmp"
"""Where the instances' ipc folders go: a short fixed root, not the workdir (under pytest's tmp that is already
about 80 bytes), since vLLM puts every ipc socket there (most named by a 36-character uuid) and a unix socket
path holds at most 107 bytes."""


def rpc_dir(http_port: int) -> str:
    """The folder a vLLM instance keeps its ipc sockets in (VLLM_RPC_BASE_PATH), its own on this host.

    MooncakeStoreConnector's lookup server binds ipc://<VLLM_RPC_BASE_PATH, default the temp dir>/lookup_rpc_
    port_<lookup_rpc_port>_host_<hostname>_dp_rank<r> (store/worker.py, vLLM 0.32 and 0.33), unlinking what is
    there first: with one base path, a prefill and a decode of one host share a path and the second to start
    takes the first one's lookups over (and stopping either deletes the other's socket). Named after the
    instance's HTTP port, which no other running instance on the host has."""
    return f"{RPC_ROOT}/epd-rpc-{http_port}"


def readiness(bundle: RoleBundle) -> Readiness:
    """Where the role shows it is up, as its pod's probes would ask."""
    if bundle.master is not None:
        return Readiness(url=bundle.master.health_url(LOOPBACK))
    if bundle.store_client is not None:
        return Readiness(tcp=(LOOPBACK, bundle.store_client.port))
    if bundle.vllm is not None:
        return Readiness(url=f"http://{LOOPBACK}:{bundle.vllm.port}/health")
    if bundle.proxy is not None:
        return Readiness(url=f"http://{LOOPBACK}:{bundle.proxy.port}/health")
    return Readiness()


def all_ports(plan: LocalPlan) -> list[int]:
    """Every port the plan's servers will bind (the runner checks they are free before it starts)."""
    return sorted({port for instance in plan.instances for port in instance.ports.values()})
