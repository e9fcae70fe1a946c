"""The store's bundles: the Mooncake master, the standalone store clients, and the vLLM-side Mooncake JSON.

The store clients' config is the single source of the requesters' JSON (`requester_config`), so master
address, metadata server, protocol, tenant and offload can only agree. Replica counts never enter a bundle:
scaling the store clients must not roll the master or any vLLM role.
"""

from __future__ import annotations

from epd_connectors.config.bundle import Peers, RoleBundle
from epd_connectors.config.master import HAConfig, MasterConfig, SnapshotConfig, TenantQuota, TenantQuotaPolicy
from epd_connectors.config.mooncake import MooncakeStoreConfig, Protocol, StoreMode
from epd_connectors.config.roles import Role
from epd_connectors.config.store_client import StoreClientConfig
from epd_operator.api import constants as c
from epd_operator.api.resource import InvalidSpecError
from epd_operator.api.store import StoreSpec
from epd_operator.derive import ports
from epd_operator.render.context import Context

TENANT_POLICY_NAME = "tenant_quota.yaml"
TENANT_POLICY_FILE = f"{c.WORK_DIR}/{TENANT_POLICY_NAME}"
"""The master's quota policy: on the writable work volume, since Mooncake rewrites it on quota changes."""
SNAPSHOT_DIR_NAME = "master-snapshots"
"""A single master's snapshots: on the work volume, which a restarted container keeps."""
DEFAULT_SNAPSHOT_INTERVAL_S = 30
"""spec.store.master.snapshotIntervalSeconds unset: a restart loses at most the last 30 s of puts; Mooncake's
own default (600 s) would lose ten minutes of cached embeddings."""
UNBOUNDED_QUOTA = 2**60
"""The tenant's quota when spec.store.tenant.quota is unset ("the whole pool"): larger than any pool, and not
derived from the store clients' count, which would put a replica count into the master's bundle."""


def _store(ctx: Context) -> StoreSpec:
    if ctx.spec.store is None:  # callers only ask with a store; a guard for the type checker
        raise InvalidSpecError(["spec.store: missing. Fix: add spec.store"])
    return ctx.spec.store


def master_config(ctx: Context) -> MasterConfig:
    """The master's flags from spec.store.master; isolation adds the tenant's quota policy."""
    store = _store(ctx)
    master = store.master
    policy = None
    if store.tenant.isolation:
        quota = store.tenant.quota or UNBOUNDED_QUOTA
        policy = TenantQuotaPolicy(tenants=(TenantQuota(name=ctx.tenant_id, quota=quota),))
    workload = ctx.names.workload(Role.MASTER)
    policy_file = f"{ctx.site.paths.work_dir}/{TENANT_POLICY_NAME}"
    # A site that binds one address (the local runner's loopback) gets every listener of the master on it;
    # a cluster keeps Mooncake's all-interfaces default (probes and peers come to the pod's IP).
    bind = ctx.site.network.bind_host
    addresses: dict[str, str] = {"rpc_address": bind, "metrics_host": bind} if bind is not None else {}
    ha = snapshot = None
    if master.ha is not None:
        # Each master advertises its own address through the election; the deployment's tenant id keeps its
        # election apart from other deployments' on a shared etcd.
        ha = HAConfig(
            endpoints=tuple(master.ha.etcd_endpoints),
            cluster_id=ctx.tenant_id,
            enable_oplog=master.ha.replicate_metadata,
        )
        addresses.setdefault("rpc_address", ctx.own_address)
    elif master.snapshot_interval_seconds != 0:
        interval = master.snapshot_interval_seconds or DEFAULT_SNAPSHOT_INTERVAL_S
        snapshot = SnapshotConfig(interval_s=interval, path=f"{ctx.site.paths.work_dir}/{SNAPSHOT_DIR_NAME}")
    return MasterConfig(
        **addresses,
        ha=ha,
        snapshot=snapshot,
        rpc_port=ctx.port(workload, ports.RPC, master.rpc_port),
        metrics_port=ctx.port(workload, ports.METRICS, master.metrics_port),
        enable_http_metadata_server=master.http_metadata_server,
        http_metadata_server_port=(
            ctx.port(workload, ports.METADATA, master.http_metadata_port)
            if master.http_metadata_server
            else master.http_metadata_port
        ),
        enable_multi_tenants=store.tenant.isolation,
        tenant_quota_policy=policy,
        tenant_quota_policy_path=policy_file if store.tenant.isolation else "",
        enable_offload=store.mode == "standalone" and store.clients.offload.enabled,
        eviction_high_watermark_ratio=master.eviction_high_watermark_ratio,
        eviction_ratio=master.eviction_ratio,
    )


def store_client_config(ctx: Context, master: MasterConfig) -> StoreClientConfig:
    """A standalone store client; `host` is the site's own address, in a cluster the placeholder epd-launch
    replaces with the pod's IP (POD_IP)."""
    store = _store(ctx)
    clients = store.clients
    offload = clients.offload.enabled
    workload = ctx.names.workload(Role.STORE_CLIENT)
    return StoreClientConfig(
        host=ctx.own_address,
        port=ctx.port(workload, ports.RPC, clients.port),
        global_segment_size=clients.segment_size,
        local_buffer_size=clients.local_buffer_size,
        master_server_address=ctx.names.master_address(master),
        metadata_server=ctx.names.metadata_server(master),
        protocol=Protocol(store.protocol),
        device_name=store.device_name,
        tenant_id=ctx.tenant_id,
        cluster_id=master.client_cluster_id(),
        enable_offload=offload,
        offload_path=ctx.site.paths.offload_dir if offload else "",
        # Metrics for scraping (the probes use the RPC port). mooncake_client has no flag for its HTTP server's
        # address (it binds every interface), so a site that binds one address (loopback) runs it without.
        **(
            {
                "enable_http_server": True,
                "http_port": ctx.port(workload, ports.METRICS, ports.STORE_CLIENT_METRICS_PORT),
            }
            if ctx.site.network.bind_host is None
            else {}
        ),
    )


def requester_config(ctx: Context, master: MasterConfig) -> MooncakeStoreConfig:
    """The vLLM-side Mooncake JSON: derived from the store client in standalone mode (so every shared field
    agrees), or an embedded pool member contributing spec.store.embeddedSegmentSize."""
    store = _store(ctx)
    if store.mode == "standalone":
        return store_client_config(ctx, master).requester_config(local_buffer_size=store.local_buffer_size)
    return MooncakeStoreConfig(
        metadata_server=ctx.names.metadata_server(master),
        master_server_address=ctx.names.master_address(master),
        protocol=Protocol(store.protocol),
        device_name=store.device_name,
        mode=StoreMode.EMBEDDED,
        global_segment_size=store.embedded_segment_size,
        local_buffer_size=store.local_buffer_size,
        enable_offload=False,
        tenant_id=ctx.tenant_id,
        cluster_id=master.client_cluster_id(),
    )


def master_peers(ctx: Context, master: MasterConfig) -> Peers:
    """What a store user waits for: the master's health (and its metrics, for mounted capacity)."""
    return Peers(
        master_health_url=ctx.names.master_health_url(master),
        master_metrics_url=ctx.names.master_metrics_url(master),
    )


def master_bundle(ctx: Context, master: MasterConfig) -> RoleBundle:
    return RoleBundle(deployment=ctx.owner.name, namespace=ctx.owner.namespace, role=Role.MASTER, master=master)


def store_client_bundle(ctx: Context, master: MasterConfig) -> RoleBundle:
    return RoleBundle(
        deployment=ctx.owner.name,
        namespace=ctx.owner.namespace,
        role=Role.STORE_CLIENT,
        store_client=store_client_config(ctx, master),
        peers=Peers(master_health_url=ctx.names.master_health_url(master)),
    )
