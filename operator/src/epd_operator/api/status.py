"""The EPDDeployment status: what the operator reports back (per-role counts, derived values, conditions)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from epd_operator.api._base import ApiModel

Phase = Literal["Pending", "Progressing", "Ready", "Degraded", "Invalid"]


class RoleStatus(ApiModel):
    """Replica counts of one role, summed over its workloads."""

    desired: int = 0
    """Replicas the spec asks for (an autoscaled role: its autoscaler, now)."""
    ready: int = 0
    """Replicas whose pods are Ready."""
    updated: int = 0
    """Replicas running the current bundle (pod template)."""
    current: int = 0
    """Pods that exist, old and new (more than desired during a rollout, fewer while a scale-up starts)."""


class Condition(ApiModel):
    """A standard Kubernetes condition (metav1.Condition)."""

    type: str
    """Valid, StoreReady, EncodersReady, PrefillReady, DecodeReady, ProxyReady, TransferReady, Ready, Redundant or
    Autoscaling."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    """One CamelCase word for machines."""
    message: str = ""
    """What a human should know, including the fix for a failure."""
    observed_generation: int = 0
    """The spec generation the condition was computed from."""
    last_transition_time: str
    """When status last changed (RFC 3339); kept while the status stays the same."""


class TenantUse(ApiModel):
    """This deployment's tenant in a store with tenant isolation, as the master accounts it."""

    name: str
    """The tenant id."""
    quota_bytes: int = 0
    """The tenant's effective quota."""
    used_bytes: int = 0
    """Bytes charged against it."""
    over_quota: bool = False
    """The master refuses the tenant's puts (mooncake_tenant_quota_over_quota)."""


class StoreStatus(ApiModel):
    """The Mooncake store as its master reports it (read from the master's /health and /metrics)."""

    reachable: bool = False
    """The master answered and serves."""
    message: str = ""
    """Why it is not reachable or not serving."""
    capacity_bytes: int = 0
    """Memory of every mounted segment together."""
    used_bytes: int = 0
    """Memory allocated to stored objects."""
    key_count: int = 0
    """Objects stored."""
    mounted_clients: int = 0
    """Clients the master counts as active."""
    segments: list[str] = []
    """Mounted segments (the address of the process that holds each)."""
    tenant: TenantUse | None = None
    """This deployment's tenant, when the master isolates tenants."""
    leader: str = ""
    """With HA masters, the RPC address (pod IP:port) of the master that leads; "" with one master."""


class TransferPair(ApiModel):
    """One transfer path whose canaries fail, as the proxy reports it."""

    path: Literal["ec", "kv"]
    """ec: an encoder's push to an EC consumer; kv: a prefill's KV cache to a decode."""
    sender: str
    """The encoder or prefill pod (its address where the proxy does not know the pod)."""
    receiver: str
    """The EC consumer or decode pod."""
    error: str = ""
    """What the last canary got."""


class TransferStatus(ApiModel):
    """The transfer paths as the proxy's canaries find them (read from the proxy's /health)."""

    reachable: bool = False
    """The proxy answered with a report."""
    message: str = ""
    """Why there is no report."""
    checking: bool = True
    """The proxy sends canaries (false: it was told not to)."""
    pairs: int = 0
    """Pairs the proxy may route through."""
    proven: int = 0
    """Pairs whose last canaries passed."""
    failing: list[TransferPair] = []
    """Pairs out of routing, their canaries failing."""
    slowest_ms: float = 0.0
    """The slowest last canary of a working pair (an encode and a token, or a prefill and a token)."""


class DeploymentValues(ApiModel):
    """What the operator derived for the spec it acted on: render makes them (`render.Derived` extends this) and the
    status carries them as they are."""

    endpoint: str = ""
    """The proxy's in-cluster URL (OpenAI-compatible API)."""
    tenant_id: str = ""
    """The store tenant every component uses."""
    embedding_cache_prefix: str = ""
    """The cross-encoder cache prefix in use."""
    kv_cache_prefix: str = ""
    """The KV cache prefix in use."""
    model_revision: str = ""
    """The revision label the encoder, prefill, decode and PD pods of the current spec carry (a hash of the model
    identity and weights source); pods with another value are from an earlier model."""
    store_tp_size: int = 0
    """The store TP (LCM of prefill TP sizes); 0 when no KV store is used."""


class EPDDeploymentStatus(DeploymentValues):
    """Observed state of an EPDDeployment: the derived values, then what the operator observed."""

    observed_generation: int = 0
    """The last spec generation the operator acted on."""
    phase: Phase = "Pending"
    """Summary: Pending, Progressing, Ready, Degraded or Invalid."""
    roles: dict[str, RoleStatus] = {}
    """Per role (master, storeClients, encoder, prefill, decode, pd, proxy)."""
    roles_ready: dict[str, str] = {}
    """"ready/desired" per role, for kubectl's columns."""
    store: StoreStatus | None = None
    """The store as its master reports it; unset without spec.store or while the operator does not read it."""
    transfers: TransferStatus | None = None
    """The transfer paths as the proxy's canaries find them; unset while the operator does not read them."""
    conditions: list[Condition] = []
    """Valid, StoreReady, EncodersReady, PrefillReady, DecodeReady, ProxyReady, TransferReady, Ready, Redundant
    (every serving role runs two or more replicas) and Autoscaling (every autoscaler can scale); the last two are
    not part of Ready."""
