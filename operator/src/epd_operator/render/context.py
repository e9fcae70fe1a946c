"""The one parameters object every render function takes: the spec, its owner, and the derived values.

Derived values are computed once here (from derive) so that every role's bundle reads the same tenant, prefixes,
store TP and hash seed; a render function never recomputes one. `Unit` describes one workload of a role.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from epd_connectors.config.bundle import POD_IP_PLACEHOLDER
from epd_connectors.config.roles import Role
from epd_connectors.config.vllm import VllmVersion
from epd_operator.api.autoscaling import AutoscalingSpec
from epd_operator.api.resource import OperatorDefaults, Owner
from epd_operator.api.spec import EPDDeploymentSpec
from epd_operator.derive import identity, parallel, ports
from epd_operator.derive import site as sites
from epd_operator.derive.names import MAIN_POOL, Names

SHARED_DIR: Final = sites.SHARED_DIR
"""Where spec.sharedStorage is mounted in every pod that uses a shared-storage connector."""
EC_SUBDIR: Final = "ec"
"""ECExampleConnector's folder under the shared dir (a subfolder, so EC and KV files of one volume never mix)."""
KV_SUBDIR: Final = "kv"
"""ExampleConnector's (KV) folder under the shared dir."""
EC_SHARED_PATH: Final = f"{SHARED_DIR}/{EC_SUBDIR}"
KV_SHARED_PATH: Final = f"{SHARED_DIR}/{KV_SUBDIR}"
OFFLOAD_DIR: Final = sites.OFFLOAD_DIR
"""The store client's SSD tier (MOONCAKE_OFFLOAD_FILE_STORAGE_PATH)."""


@dataclass(frozen=True)
class Unit:
    """One workload of a role (a prefill pool is a unit of its own)."""

    role: Role
    name: str
    """Name of the workload, its Service and its PDB."""
    spec_path: str
    """Where the user configures it, for error messages (spec.encoder, spec.prefill.additionalPools[0])."""
    pool: str | None = None
    """The prefill pool label (None for other roles)."""
    tensor_parallel_size: int = 1
    replicas: int | None = 1
    """None for a DaemonSet."""
    autoscaling: AutoscalingSpec | None = None
    """Set: an autoscaler owns the replicas, and the workload is rendered without them."""


@dataclass(frozen=True)
class Context:
    """Everything render needs, derived once."""

    owner: Owner
    spec: EPDDeploymentSpec
    defaults: OperatorDefaults
    names: Names
    tenant_id: str
    """"" without a store."""
    embedding_prefix: str
    """"" unless cross-encoder reuse is on."""
    kv_prefix: str
    """"" unless a role uses MooncakeStoreConnector."""
    prefill_tp_sizes: tuple[int, ...]
    """() without a prefill pool."""
    store_tp: int
    """LCM of prefill_tp_sizes with a store KV connector on a P/D split, else 0."""
    hash_seed: int
    model_revision: str
    """The vLLM pods' revision label (derive.identity.model_revision)."""
    vllm_version: VllmVersion
    """The vLLM the vllm image runs (spec.images.vllmVersion, else the operator's default)."""
    site: sites.Site = sites.CLUSTER
    """Addresses and paths (derive.site): a cluster's unless the local runner renders."""

    def port(self, workload: str, name: str, default: int) -> int:
        """The workload's port called `name` (derive.ports) on this site: `default` in a cluster."""
        return self.site.network.port(workload, name, default)

    def vllm_http_port(self, unit: Unit) -> int:
        """A vLLM unit's OpenAI server: what the proxy calls and what the server binds."""
        return self.port(unit.name, ports.HTTP, ports.VLLM_HTTP_PORT)

    def ec_port(self, unit: Unit) -> int:
        """An EC consumer's control port of TP rank 0: what it binds (ec_port) and where the proxy tells the
        encoders to push."""
        return self.port(unit.name, ports.ec_port_name(0), ports.EC_CONTROL_PORT)

    def bootstrap_port(self, unit: Unit) -> int:
        """A prefill's MooncakeConnector bootstrap server: what it binds and where decodes find it."""
        return self.port(unit.name, ports.BOOTSTRAP, ports.KV_BOOTSTRAP_PORT)

    @property
    def bind_host(self) -> dict[str, str]:
        """`{"host": ...}` for a server config when the site binds one address, else {} (the config's default)."""
        host = self.site.network.bind_host
        return {"host": host} if host is not None else {}

    @property
    def own_address(self) -> str:
        """What a process advertises to its peers: the site's address, else the placeholder epd-launch replaces
        with POD_IP."""
        return self.site.network.own_address or POD_IP_PLACEHOLDER

    def shared_path(self, subdir: str) -> str:
        return f"{self.site.paths.shared_dir}/{subdir}"

    @property
    def protocol(self) -> str:
        """One transport for the store and every Mooncake connector; rdma (Mooncake's default) without store."""
        return self.spec.store.protocol if self.spec.store else "rdma"

    @property
    def device_name(self) -> str:
        return self.spec.store.device_name if self.spec.store else ""


def build_context(
    owner: Owner, spec: EPDDeploymentSpec, defaults: OperatorDefaults, where: sites.Site = sites.CLUSTER
) -> Context:
    """Derive every shared value from the spec (see derive/ for each rule); `where` is the site's seam."""
    store, prefill = spec.store, spec.prefill
    cross_encoder = spec.encoder.cross_encoder_cache
    sizes = parallel.prefill_tp_sizes(prefill) if prefill is not None else ()
    vllm = spec.images.vllm_version or defaults.vllm_version
    return Context(
        owner=owner,
        spec=spec,
        defaults=defaults,
        names=Names(owner.name, owner.namespace, where.network),
        tenant_id=identity.tenant_id(store.tenant.id, owner.namespace, owner.name) if store else "",
        embedding_prefix=(
            identity.embedding_cache_prefix(spec.model, cross_encoder.prefix, vllm=vllm)
            if cross_encoder.enabled
            else ""
        ),
        kv_prefix=(
            identity.kv_cache_prefix(spec.model, store.kv_cache_prefix, vllm=vllm)
            if store and spec.uses_kv_store
            else ""
        ),
        prefill_tp_sizes=sizes,
        store_tp=parallel.store_tp_size(sizes) if spec.store_kv_split else 0,
        hash_seed=identity.python_hash_seed(owner.namespace, owner.name),
        model_revision=identity.model_revision(spec.model, vllm=vllm),
        vllm_version=vllm,
        site=where,
    )


def units(ctx: Context) -> list[Unit]:
    """Every workload, in apply order: master, store clients, encoders, prefill pools, decode or PD, proxy."""
    spec, names = ctx.spec, ctx.names
    found: list[Unit] = []
    if spec.store is not None:
        ha = spec.store.master.ha
        masters = ha.replicas if ha is not None else 1
        found.append(Unit(Role.MASTER, names.workload(Role.MASTER), "spec.store.master", replicas=masters))
        clients = spec.store.clients
        if spec.store.mode == "standalone":
            found.append(
                Unit(
                    Role.STORE_CLIENT,
                    names.workload(Role.STORE_CLIENT),
                    "spec.store.clients",
                    replicas=None if clients.per_node else clients.replicas,
                )
            )
    enc = spec.encoder
    found.append(
        Unit(
            Role.ENCODER,
            names.workload(Role.ENCODER),
            "spec.encoder",
            None,
            enc.tensor_parallel_size,
            enc.replicas,
            enc.autoscaling,
        )
    )
    if spec.prefill is not None:
        p = spec.prefill
        found.append(
            Unit(
                Role.PREFILL,
                names.workload(Role.PREFILL),
                "spec.prefill",
                MAIN_POOL,
                p.tensor_parallel_size,
                p.replicas,
                p.autoscaling,
            )
        )
        for i, pool in enumerate(p.additional_pools):
            found.append(
                Unit(
                    Role.PREFILL,
                    names.workload(Role.PREFILL, pool.name),
                    f"spec.prefill.additionalPools[{i}]",
                    pool.name,
                    pool.tensor_parallel_size,
                    pool.replicas,
                    pool.autoscaling,
                )
            )
    lm_role = Role.DECODE if spec.prefill is not None else Role.PD
    dec = spec.decode
    found.append(
        Unit(
            lm_role,
            names.workload(lm_role),
            "spec.decode",
            None,
            dec.tensor_parallel_size,
            dec.replicas,
            dec.autoscaling,
        )
    )
    found.append(Unit(Role.PROXY, names.workload(Role.PROXY), "spec.proxy", replicas=spec.proxy.replicas))
    return found
