"""The Mooncake store's spec: its master, its store clients, the tenant and who may scrape it."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from epd_connectors.config.base import Port
from epd_operator.api import kube as k
from epd_operator.api._base import ApiModel, LabelMap, NodePath, PositiveQuantity, Quantity, Resources
from epd_operator.api._rules import Rule, RuledModel

EtcdEndpoint = Annotated[
    str, Field(max_length=k.STRING_MAX, pattern=r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?:[0-9]{1,5}$")
]


class MasterHASpec(ApiModel):
    """Several masters with one elected leader (Mooncake's HA, through an etcd the user runs)."""

    replicas: int = Field(default=2, ge=2, le=5)
    """Masters: one leads and serves, the others stand by and take over within about 10 s of its loss."""
    etcd_endpoints: list[EtcdEndpoint] = Field(min_length=1, max_length=7)
    """HOST:PORT of each member of the etcd the masters elect through. Each deployment elects under its own
    key (its tenant id), so deployments may share one etcd."""
    replicate_metadata: bool = True
    """The leader writes every object's metadata to the standbys through etcd (Mooncake's oplog), so a new
    leader serves the cached embeddings and KV blocks the old one had; false: a failover empties the store."""


class MasterSpec(RuledModel):
    """The Mooncake master (the store's metadata service)."""

    RULES: ClassVar[tuple[Rule[MasterSpec], ...]] = (
        Rule(
            "spec.store.master.httpMetadataServer",
            lambda s: s.ha is None or not s.http_metadata_server,
            lambda s: s.http_metadata_server,
            "HA masters each keep their own metadata server, and a failover would lose every peer's metadata",
            "leave httpMetadataServer false (peers then hand metadata over directly, P2PHANDSHAKE)",
            cel="!has(self.ha) || !has(self.httpMetadataServer) || !self.httpMetadataServer",
            cel_message="spec.store.master: HA masters need httpMetadataServer false (a failover would lose "
            "the metadata)",
        ),
        Rule(
            "spec.store.master.snapshotIntervalSeconds",
            lambda s: s.ha is None or not s.snapshot_interval_seconds,
            lambda s: s.snapshot_interval_seconds,
            "HA masters keep objects across a failover through ha.replicateMetadata; a standby never restores a "
            "snapshot, and Mooncake refuses clients when both run",
            "remove snapshotIntervalSeconds (or set it 0)",
            cel="!has(self.ha) || !has(self.snapshotIntervalSeconds) || self.snapshotIntervalSeconds == 0",
            cel_message="spec.store.master: HA masters replicate metadata instead of snapshotting it; remove "
            "snapshotIntervalSeconds",
        ),
    )

    rpc_port: Port = 50051
    """Clients' RPC port."""
    metrics_port: Port = 9003
    """Serves /metrics and /health (the readiness probe)."""
    http_metadata_server: bool = False
    """Serve transfer-engine metadata over HTTP instead of peer-to-peer handshakes."""
    http_metadata_port: Port = 8080
    """Port of that metadata server."""
    eviction_high_watermark_ratio: float = Field(default=0.9, ge=0, le=1)
    """Pool fill ratio at which eviction starts."""
    eviction_ratio: float = Field(default=0.05, ge=0, le=1)
    """Fraction evicted per round."""
    resources: Resources = Resources()
    """The master's resources (1 CPU and 2 GiB requested when empty)."""
    node_selector: LabelMap = {}
    """Nodes for the master (e.g. CPU nodes: it holds no GPU memory)."""
    ha: MasterHASpec | None = None
    """Several masters, one leading; unset runs one master."""
    snapshot_interval_seconds: int | None = Field(default=None, ge=0, le=86400)
    """A single master snapshots its metadata this often to its pod's work volume and restores the last snapshot
    when its container restarts, so a restart loses only the puts since (a deleted pod loses its volume and every
    object). Unset: every 30 s; 0: never (a restart empties the store). Not with ha (it replicates instead)."""


class OffloadSpec(ApiModel):
    """The SSD tier under each store client."""

    enabled: bool = False
    """Keep evicted objects on local disk (master, store clients and vLLM JSON are switched together)."""
    size_limit: PositiveQuantity = 100 * 1024**3
    """Disk space per store client."""
    host_path: NodePath | None = None
    """A node directory for the tier; an emptyDir of size_limit when unset."""


class StoreClientsSpec(RuledModel):
    """Standalone store clients: the processes that own the RAM pool."""

    RULES: ClassVar[tuple[Rule[StoreClientsSpec], ...]] = (
        Rule(
            "spec.store.clients.replicas",
            lambda s: not s.per_node or s.replicas <= 1,
            lambda s: s.replicas,
            "perNode runs one per node",
            "leave replicas at 1",
            cel="!has(self.perNode) || !self.perNode || !has(self.replicas) || self.replicas <= 1",
            cel_message="spec.store.clients: perNode runs one per node; leave replicas at 1",
        ),
    )

    replicas: int = Field(default=1, ge=0, le=k.REPLICAS_MAX)
    """Number of store clients (a StatefulSet); ignored with perNode."""
    per_node: bool = False
    """One store client on every node matching nodeSelector (a DaemonSet)."""
    node_selector: LabelMap = {}
    """Nodes for the store clients."""
    port: Port = 50052
    """The client's RPC port."""
    segment_size: PositiveQuantity = 4 * 1024**3
    """RAM each client contributes to the pool."""
    local_buffer_size: Quantity = 0
    """Registered staging buffer of the client itself."""
    offload: OffloadSpec = OffloadSpec()
    """The SSD tier."""
    resources: Resources = Resources()
    """Extra resources; memory is raised to at least segment + buffer + overhead."""


class TenantSpec(ApiModel):
    """The store tenant this deployment reads and writes under."""

    id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    """Tenant id; derived from the namespace and name when unset (stable for the deployment's life)."""
    isolation: bool = False
    """Strict isolation: the master admits only listed tenants and enforces quotas."""
    quota: PositiveQuantity | None = None
    """The tenant's byte quota with isolation; the whole pool when unset."""


class MetricsPeerSpec(RuledModel):
    """Pods admitted to the store's metrics ports (a NetworkPolicy peer): those matching both selectors given."""

    RULES: ClassVar[tuple[Rule[MetricsPeerSpec], ...]] = (
        Rule(
            "spec.store.metricsFrom[]",
            lambda s: s.namespace_selector is not None or s.pod_selector is not None,
            lambda s: {},
            "a peer needs namespaceSelector or podSelector",
            "name the scraper's namespace or pods, e.g. namespaceSelector: {app: monitoring}",
            cel="has(self.namespaceSelector) || has(self.podSelector)",
            cel_message="spec.store.metricsFrom[]: a peer needs namespaceSelector or podSelector",
        ),
    )

    namespace_selector: LabelMap | None = None
    """Labels of the scraper's namespace (e.g. kubernetes.io/metadata.name: monitoring); unset: this namespace."""
    pod_selector: LabelMap | None = None
    """Labels of the scraper's pods; unset: every pod of the selected namespaces."""


class StoreSpec(RuledModel):
    """The Mooncake store."""

    RULES: ClassVar[tuple[Rule[StoreSpec], ...]] = (
        Rule(
            "spec.store.clients.replicas",
            lambda s: s.mode != "standalone" or s.clients.per_node or s.clients.replicas > 0,
            lambda s: s.clients.replicas,
            "standalone mode needs store clients",
            "set clients.replicas > 0 or clients.perNode",
            cel="!has(self.mode) || self.mode != 'standalone' || !has(self.clients) "
            "|| (has(self.clients.perNode) && self.clients.perNode) "
            "|| !has(self.clients.replicas) || self.clients.replicas > 0",
            cel_message="spec.store.clients: standalone mode needs store clients; "
            "set clients.replicas > 0 or clients.perNode",
        ),
    )

    mode: Literal["standalone", "embedded"] = "standalone"
    """standalone: store clients own the pool and vLLM ranks are pure requesters; embedded: each vLLM rank
    contributes embeddedSegmentSize of its own memory."""
    protocol: Literal["rdma", "tcp"] = "rdma"
    """Transport for every store and transfer connection."""
    device_name: str = Field(default="", max_length=k.STRING_MAX)
    """RDMA devices (e.g. mlx5_0); empty lets Mooncake choose."""
    master: MasterSpec = MasterSpec()
    """The master."""
    clients: StoreClientsSpec = StoreClientsSpec()
    """Store clients (standalone mode)."""
    embedded_segment_size: PositiveQuantity = 4 * 1024**3
    """RAM each vLLM rank contributes in embedded mode."""
    local_buffer_size: PositiveQuantity = 512 * 1024**2
    """Registered transfer buffer of each vLLM rank."""
    tenant: TenantSpec = TenantSpec()
    """Tenant and isolation."""
    kv_cache_prefix: str | None = Field(default=None, max_length=k.STRING_MAX, pattern=r"^[^@\s]+$")
    """Override of the derived KV cache prefix (MooncakeStoreConnector cache_prefix)."""
    kv_lookup_timeout_seconds: float | None = Field(default=None, gt=0, le=600)
    """vLLM 0.34 only: seconds a prefix lookup in the store may take before it counts as a miss
    (MooncakeStoreConnector lookup_timeout_s; vLLM's default 1.0; 0.33 waits without a bound)."""
    metrics_from: list[MetricsPeerSpec] = Field(default=[], max_length=k.MAP_MAX)
    """Who may scrape the master's and the store clients' metrics ports besides the store's users (Prometheus).
    The master's metrics port also serves Mooncake's admin API, so admit only the scraper."""
