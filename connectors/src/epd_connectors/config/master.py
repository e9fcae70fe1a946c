"""The mooncake_master process: its flags, the tenant quota policy file it reads, and its URLs.

The master is configured only by gflags, and some combinations start a process that then dies or serves
nothing useful (multi-tenancy without a policy file crashes; HA without a backend address exits; oplog needs
etcd). This model refuses those combinations and renders the argv with every modelled flag explicit, so the
pod spec shows exactly what runs. Flag names were checked against ``mooncake_master --help`` of
mooncake-transfer-engine 0.3.13.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Self

import yaml
from pydantic import Field, StrictBool, ValidationInfo, field_validator, model_validator

from epd_connectors.config import base
from epd_connectors.config import mooncake as mc
from epd_connectors.config.sizes import ByteSize

DEFAULT_RPC_PORT = mc.DEFAULT_MASTER_PORT
DEFAULT_METRICS_PORT = 9003
DEFAULT_HTTP_METADATA_PORT = 8080
MASTER_BINARY = "mooncake_master"
_ALL_INTERFACES = "0.0.0.0"  # the master in a pod listens on every interface


class TenantQuota(base.ConfigModel):
    """One tenant admitted by a multi-tenant master, and the bytes it may hold in the pool."""

    name: str
    """The tenant id clients pass (vLLM JSON tenant_id, mooncake_client --tenant_id)."""

    quota: ByteSize
    """Bytes this tenant may hold; puts beyond it fail with -1700. Must be > 0 (Mooncake: 0 is invalid)."""

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        return mc.check_tenant_id("tenants[].name", value)

    @field_validator("quota")
    @classmethod
    def _check_quota(cls, value: int) -> int:
        if value <= 0:
            raise base.rule_error(
                "tenants[].quota",
                value,
                "Mooncake refuses a tenant without quota",
                "give a positive size such as '64 GiB', or remove the tenant",
            )
        return value


class TenantQuotaPolicy(base.ConfigModel):
    """The YAML file ``--tenant_quota_connector_uri`` names: which tenants exist and their quotas."""

    version: int = 1
    """Policy format version; Mooncake 0.3.13 accepts only 1."""

    tenants: tuple[TenantQuota, ...] = ()
    """Admitted tenants; a tenant not listed is refused with -1701 when multi-tenancy is on."""

    @field_validator("version")
    @classmethod
    def _check_version(cls, value: int) -> int:
        if value != 1:
            raise base.rule_error("version", value, "Mooncake reads only policy version 1", "set version: 1")
        return value

    @model_validator(mode="after")
    def _check_unique(self) -> Self:
        seen: set[str] = set()
        for tenant in self.tenants:
            if tenant.name in seen:
                raise base.rule_error("tenants", tenant.name, "a tenant is listed twice", "list each tenant name once")
            seen.add(tenant.name)
        return self

    def to_yaml(self) -> str:
        """The policy file; quotas as byte integers (Mooncake's own writer does the same)."""
        doc = {"version": self.version, "tenants": [{"name": t.name, "quota": t.quota} for t in self.tenants]}
        return yaml.safe_dump(doc, sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str) -> TenantQuotaPolicy:
        """Parse a policy file; raises ValueError (pydantic.ValidationError for a map that breaks a rule)."""
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(
                f"tenant quota policy: not valid YAML ({exc}). Fix: write 'version: 1' and a 'tenants:' list"
            ) from exc
        if not isinstance(data, dict):
            raise ValueError(
                f"tenant quota policy = {type(data).__name__}: the file must be a YAML map. "
                "Fix: write 'version: 1' and a 'tenants:' list of name and quota"
            )
        return cls.model_validate(data)


class HABackend(StrEnum):
    """Where HA masters elect their leader (``--ha_backend_type``)."""

    ETCD = "etcd"
    REDIS = "redis"
    K8S = "k8s"


class HAConfig(base.ConfigModel):
    """Leader election for several masters; clients then find the leader through the same backend."""

    backend: HABackend = HABackend.ETCD
    """etcd is Mooncake's default backend and the only one that supports oplog replication."""

    endpoints: tuple[str, ...] = ()
    """HOST:PORT of the backend: one or more etcd members, or exactly one redis server. Empty for k8s."""

    k8s_lease: str = ""
    """NAMESPACE/NAME of the coordination Lease for the k8s backend; "" for etcd and redis."""

    cluster_id: str = mc.DEFAULT_CLUSTER_ID
    """The election this master joins (``--cluster_id``; etcd key mooncake-store/<id>/master_view); every
    client follows it through MC_STORE_CLUSTER_ID. Deployments sharing one etcd need distinct ids, or they
    elect one leader between them."""

    enable_oplog: StrictBool = False
    """Replicate metadata to standbys through an oplog so a failover keeps keys; needs etcd. Off by default,
    as in Mooncake: without it a failover loses every key (like a restart)."""

    @field_validator("endpoints")
    @classmethod
    def _check_endpoints(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for endpoint in value:
            mc.check_host_port("ha.endpoints[]", endpoint)
        return value

    @field_validator("cluster_id")
    @classmethod
    def _check_cluster_id(cls, value: str) -> str:
        return mc.check_tenant_id("ha.cluster_id", value)

    @model_validator(mode="after")
    def _check_backend(self) -> Self:
        if self.backend is HABackend.K8S:
            if not self.k8s_lease or self.endpoints:
                raise base.rule_error(
                    "ha.k8s_lease",
                    self.k8s_lease,
                    "the k8s backend needs a Lease and no endpoints",
                    "set k8s_lease to 'NAMESPACE/NAME' and leave endpoints empty",
                )
            mc.check_master_address("ha.k8s_lease", f"k8s://{self.k8s_lease}")
        else:
            wanted = "one or more etcd members" if self.backend is HABackend.ETCD else "exactly one redis server"
            count_ok = len(self.endpoints) == 1 if self.backend is HABackend.REDIS else bool(self.endpoints)
            if not count_ok or self.k8s_lease:
                raise base.rule_error(
                    "ha.endpoints",
                    list(self.endpoints),
                    f"the {self.backend.value} backend needs {wanted} and no k8s_lease",
                    "list HOST:PORT endpoints, e.g. ['etcd-0:2379'] or ['redis:6379']",
                )
        if self.enable_oplog and self.backend is not HABackend.ETCD:
            raise base.rule_error(
                "ha.enable_oplog",
                True,
                f"Mooncake replicates the oplog only through etcd, not {self.backend.value}",
                "use backend etcd, or set enable_oplog false",
            )
        return self

    def connstring(self) -> str:
        """``--ha_backend_connstring``: 'H:P;H:P' for etcd, 'redis://H:P' for redis, 'NS/NAME' for k8s."""
        if self.backend is HABackend.ETCD:
            return ";".join(self.endpoints)
        if self.backend is HABackend.REDIS:
            return f"redis://{self.endpoints[0]}"
        return self.k8s_lease

    def client_address(self) -> str:
        """The master_server_address every client uses to find the current leader."""
        if self.backend is HABackend.REDIS:
            return self.connstring()
        return f"{self.backend.value}://{self.connstring()}"


def _absolute_path(field: str, value: str, what: str, fix: str) -> str:
    """A path the master is given: absolute, since it resolves `what` from its own working directory."""
    if not value.startswith("/") or any(c in value for c in "\0\n"):
        raise base.rule_error(field, value, f"the master resolves {what} from its own working directory", fix)
    return value


SNAPSHOT_PATH_ENV = "MOONCAKE_SNAPSHOT_LOCAL_PATH"
"""Where Mooncake's local snapshot store keeps its files (an environment variable; it has no flag)."""


class SnapshotConfig(base.ConfigModel):
    """Periodic snapshots of a single master's metadata into a folder, restored when a master starts again on
    that folder (a restarted container keeps its pod's volumes): the objects of the last snapshot come back,
    so a restart loses only what was put after it."""

    interval_s: int = Field(ge=1)
    """``--snapshot_interval_seconds``: the most recent puts a restart can lose."""
    path: str
    """An absolute folder on a volume that outlives the master's process."""

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        return _absolute_path("snapshot.path", value, "it", "give an absolute path")


class MasterConfig(base.ConfigModel):
    """One mooncake_master process (the store's metadata service)."""

    rpc_address: str = _ALL_INTERFACES
    """Address the RPC server binds to and, under HA, advertises; with HA it must be the pod's own IP."""

    rpc_port: base.Port = DEFAULT_RPC_PORT
    """Clients' master_server_address port; 50051 is Mooncake's default."""

    metrics_port: base.Port = DEFAULT_METRICS_PORT
    """HTTP port of /metrics (Prometheus) and /health (the readiness check); 9003 is Mooncake's default."""

    metrics_host: str | None = None
    """Address the metrics/admin server (and the HTTP metadata server) binds to; None keeps Mooncake's default,
    all interfaces, as a pod needs (probes and peers come to its IP). A single-host site gives its loopback."""

    enable_http_metadata_server: StrictBool = False
    """Serve transfer-engine metadata at http://HOST:PORT/metadata; off by default because P2PHANDSHAKE
    needs no metadata service."""

    http_metadata_server_port: base.Port = DEFAULT_HTTP_METADATA_PORT
    """Port of the HTTP metadata server (when enabled); 8080 is Mooncake's default."""

    enable_multi_tenants: StrictBool = False
    """Strict tenant isolation and quotas; needs tenant_quota_policy and tenant_quota_policy_path. Off by
    default: every client then shares the 'default' namespace without quota."""

    tenant_quota_policy: TenantQuotaPolicy | None = None
    """The admitted tenants; written to tenant_quota_policy_path by the launcher before the master starts."""

    tenant_quota_policy_path: str = ""
    """Absolute path of the policy file (``--tenant_quota_connector_uri``); must be writable, since Mooncake
    rewrites it when quotas change through its admin API."""

    enable_offload: StrictBool = False
    """Allow the SSD tier; the owner mooncake_client and the vLLM JSON must enable offload too."""

    eviction_high_watermark_ratio: float = Field(default=0.9, allow_inf_nan=False)
    """Pool fill ratio (0..1) at which eviction starts; 0.9 is Mooncake's default."""

    eviction_ratio: float = Field(default=0.05, allow_inf_nan=False)
    """Fraction (0..1) of objects evicted per round once the watermark is hit; 0.05 is Mooncake's default."""

    default_kv_lease_ttl_ms: int = 10_000
    """Milliseconds a key is protected from eviction after a read or write; 10 s is Mooncake's default."""

    client_ttl_s: int = 10
    """Seconds without heartbeat before the master drops a client and unmounts its segments; Mooncake's
    default 10 s."""

    ha: HAConfig | None = None
    """Leader election for several masters; None runs one master."""

    snapshot: SnapshotConfig | None = None
    """A single master's snapshots, restored at its restart; None: a restart loses every key. HA masters keep
    keys across a failover through the oplog instead (`ha.enable_oplog`)."""

    @field_validator("rpc_address")
    @classmethod
    def _check_rpc_address(cls, value: str) -> str:
        return mc.check_host("rpc_address", value)

    @field_validator("metrics_host")
    @classmethod
    def _check_metrics_host(cls, value: str | None) -> str | None:
        return None if value is None else mc.check_host("metrics_host", value)

    @field_validator("eviction_high_watermark_ratio", "eviction_ratio")
    @classmethod
    def _check_ratio(cls, value: float, info: ValidationInfo) -> float:
        if not 0.0 <= value <= 1.0:
            raise base.rule_error(
                str(info.field_name), value, "Mooncake aborts on a ratio outside 0..1", "give a value in 0..1"
            )
        return value

    @field_validator("default_kv_lease_ttl_ms", "client_ttl_s")
    @classmethod
    def _check_positive(cls, value: int, info: ValidationInfo) -> int:
        if value <= 0:
            raise base.rule_error(str(info.field_name), value, "must be positive", "give a positive integer")
        return value

    @field_validator("tenant_quota_policy_path")
    @classmethod
    def _check_policy_path(cls, value: str) -> str:
        fix = "give an absolute path on a writable volume, e.g. '/var/run/mooncake/tenant_quota.yaml'"
        return _absolute_path("tenant_quota_policy_path", value, "the policy file", fix) if value else value

    @model_validator(mode="after")
    def _check_combinations(self) -> Self:
        if self.enable_multi_tenants and (self.tenant_quota_policy is None or not self.tenant_quota_policy_path):
            raise base.rule_error(
                "enable_multi_tenants",
                True,
                "mooncake_master crashes at start with multi-tenancy but no quota policy file",
                "set tenant_quota_policy (the tenants and quotas) and tenant_quota_policy_path",
            )
        if not self.enable_multi_tenants and self.tenant_quota_policy is not None:
            raise base.rule_error(
                "tenant_quota_policy",
                "set",
                "a quota policy is ignored unless multi-tenancy is on",
                "set enable_multi_tenants true, or remove tenant_quota_policy",
            )
        ports = [self.rpc_port, self.metrics_port]
        if self.enable_http_metadata_server:
            ports.append(self.http_metadata_server_port)
        if len(set(ports)) != len(ports):
            raise base.rule_error(
                "ports",
                ports,
                "the master's listeners would collide",
                "give rpc_port, metrics_port and http_metadata_server_port distinct values",
            )
        if self.ha is not None and self.snapshot is not None:
            raise base.rule_error(
                "snapshot",
                "set",
                "with HA a standby takes over without restoring a snapshot (0 of 20 objects kept, measured), and "
                "with the oplog on too no client can set up (Mooncake 0.3.13)",
                "remove snapshot; keep objects across a failover with ha.enable_oplog",
            )
        if self.ha is not None and self.rpc_address == _ALL_INTERFACES:
            raise base.rule_error(
                "rpc_address",
                self.rpc_address,
                "an HA master advertises rpc_address to clients through the backend",
                "set rpc_address to the pod's own IP (downward API status.podIP)",
            )
        return self

    def argv(self, binary: str = MASTER_BINARY) -> list[str]:
        """The command line, every modelled flag explicit (gflags bools as true/false)."""
        args = [
            binary,
            f"--rpc_address={self.rpc_address}",
            f"--rpc_port={self.rpc_port}",
            f"--metrics_port={self.metrics_port}",
            f"--enable_http_metadata_server={mc.gflag(self.enable_http_metadata_server)}",
        ]
        if self.metrics_host is not None:
            args.append(f"--metrics_host={self.metrics_host}")
        if self.enable_http_metadata_server:
            args.append(f"--http_metadata_server_port={self.http_metadata_server_port}")
            if self.metrics_host is not None:
                args.append(f"--http_metadata_server_host={self.metrics_host}")
        args.append(f"--enable_multi_tenants={mc.gflag(self.enable_multi_tenants)}")
        if self.enable_multi_tenants:
            args += [
                "--tenant_quota_connector_type=file",
                f"--tenant_quota_connector_uri={self.tenant_quota_policy_path}",
            ]
        args += [
            f"--enable_offload={mc.gflag(self.enable_offload)}",
            f"--eviction_high_watermark_ratio={self.eviction_high_watermark_ratio!r}",
            f"--eviction_ratio={self.eviction_ratio!r}",
            f"--default_kv_lease_ttl={self.default_kv_lease_ttl_ms}",
            f"--client_ttl={self.client_ttl_s}",
            f"--enable_ha={mc.gflag(self.ha is not None)}",
            f"--enable_snapshot={mc.gflag(self.snapshot is not None)}",
            f"--enable_snapshot_restore={mc.gflag(self.snapshot is not None)}",
        ]
        if self.snapshot is not None:
            args += [f"--snapshot_interval_seconds={self.snapshot.interval_s}", "--snapshot_object_store_type=local"]
        if self.ha is not None:
            args += [
                f"--ha_backend_type={self.ha.backend.value}",
                f"--ha_backend_connstring={self.ha.connstring()}",
                f"--cluster_id={self.ha.cluster_id}",
                f"--enable_oplog={mc.gflag(self.ha.enable_oplog)}",
            ]
        return args

    def env(self) -> dict[str, str]:
        """Environment the master needs beyond its flags: where snapshots go."""
        return {SNAPSHOT_PATH_ENV: self.snapshot.path} if self.snapshot is not None else {}

    def files(self) -> dict[str, str]:
        """Files the launcher writes before exec: path -> content (the quota policy when multi-tenant)."""
        if self.enable_multi_tenants and self.tenant_quota_policy is not None:
            return {self.tenant_quota_policy_path: self.tenant_quota_policy.to_yaml()}
        return {}

    def health_url(self, host: str) -> str:
        """Readiness: 200 with JSON once the master serves; wait for it before any client setup()."""
        return base.address("http", host, self.metrics_port) + "/health"

    def metrics_url(self, host: str) -> str:
        """Prometheus text metrics."""
        return base.address("http", host, self.metrics_port) + "/metrics"

    def client_master_address(self, host: str) -> str:
        """What clients put in master_server_address: HOST:rpc_port, or the HA backend's client form."""
        if self.ha is not None:
            return self.ha.client_address()
        return f"{host}:{self.rpc_port}"

    def client_cluster_id(self) -> str | None:
        """What clients set as cluster_id: the election they follow, None without HA."""
        return self.ha.cluster_id if self.ha is not None else None

    def metadata_server(self, host: str) -> str:
        """What clients put in metadata_server: this master's HTTP metadata URL, or P2PHANDSHAKE."""
        if self.enable_http_metadata_server:
            return base.address("http", host, self.http_metadata_server_port) + "/metadata"
        return mc.P2P_HANDSHAKE
