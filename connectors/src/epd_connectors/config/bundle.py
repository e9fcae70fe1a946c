"""The per-role bundle: everything one pod needs, in one versioned document.

The operator renders one bundle per role into a ConfigMap; `epd-launch` reads it in the pod. Keeping the whole
runtime contract in one typed file means the launcher never has to guess, and the operator and the launcher can
be checked against the same JSON schema (`bundle_json_schema`).
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, Literal, get_args

from pydantic import Field, ValidationError, model_validator

from epd_connectors.config.base import ConfigError, ConfigModel, Port, describe_validation_error
from epd_connectors.config.bundle_rules import role_section_problems
from epd_connectors.config.ec_transfer import ECTransferConfig
from epd_connectors.config.kv_transfer import KVTransferConfig
from epd_connectors.config.master import MasterConfig
from epd_connectors.config.mooncake import MooncakeStoreConfig
from epd_connectors.config.store_client import StoreClientConfig
from epd_connectors.config.vllm import VllmRole, VllmServerConfig

BUNDLE_API_VERSION: Literal["epd.serving.io/v1alpha1"] = "epd.serving.io/v1alpha1"
BUNDLE_KIND: Literal["RoleBundle"] = "RoleBundle"


class Role(StrEnum):
    """What one pod runs. `pd` is a combined prefill+decode instance (no separate prefill pool)."""

    MASTER = "master"
    STORE_CLIENT = "store-client"
    ENCODER = "encoder"
    PREFILL = "prefill"
    DECODE = "decode"
    PD = "pd"
    PROXY = "proxy"


POD_IP_PLACEHOLDER: Literal["pod-ip.invalid"] = "pod-ip.invalid"
"""Host written into a bundle where only the pod knows the value (a store client's host, an EC consumer's ec_ip,
an HA master's rpc_address): epd-launch replaces it with POD_IP from the downward API. The .invalid TLD
(RFC 2606) never resolves, so an address that was not replaced fails loudly instead of pointing elsewhere."""

VLLM_ROLES: Final = frozenset(Role(name) for name in get_args(VllmRole))
"""The roles that run a vLLM server (and that the proxy routes to): VllmServerConfig.role's values."""


class Endpoint(ConfigModel):
    """A host and port another role listens on."""

    host: str = Field(min_length=1)
    """DNS name (a Service or pod name in a cluster) or IP address."""
    port: Port

    def url(self, scheme: str = "http") -> str:
        return f"{scheme}://{self.host}:{self.port}"


class Peers(ConfigModel):
    """Where the other roles of this deployment are; the proxy's static roster and every role's waits."""

    master_health_url: str | None = None
    """The Mooncake master's JSON health endpoint; every store user waits for it before starting."""
    master_metrics_url: str | None = None
    """The master's Prometheus metrics; in standalone-store mode encoders wait for mounted capacity here."""
    encoders: list[Endpoint] = Field(default_factory=list)
    prefill: list[Endpoint] = Field(default_factory=list)
    decode: list[Endpoint] = Field(default_factory=list)
    pd: list[Endpoint] = Field(default_factory=list)
    ec_consumers: list[str] = Field(default_factory=list)
    """EC control addresses (tcp://host:port) of every consumer rank, in the order the proxy addresses them."""


PROXY_READINESS_PATH: Final = "/health"
"""200 only when every required role has a healthy instance."""
PROXY_LIVENESS_PATH: Final = "/livez"
"""200 while the proxy serves at all: a liveness probe must not restart it while vLLM is still loading."""


class ProxySettings(ConfigModel):
    """The request proxy's own listener and routing switches."""

    host: str = "0.0.0.0"
    port: Port = 8000
    encoder_affinity: bool = True
    """Route a media item by the hash of its content to the encoder that already holds its embedding."""


class WaitSettings(ConfigModel):
    """How long a role waits for its dependencies before it exits with one clear line."""

    deadline_s: float = Field(default=600.0, gt=0)
    """Seconds; long enough for a master pod to be scheduled and pull its image."""
    interval_s: float = Field(default=1.0, gt=0)
    """Seconds between probes."""


class RoleBundle(ConfigModel):
    """Everything one role's pod needs. Sections that do not apply to the role must be absent."""

    api_version: Literal["epd.serving.io/v1alpha1"] = Field(default=BUNDLE_API_VERSION, alias="apiVersion")
    kind: Literal["RoleBundle"] = BUNDLE_KIND
    deployment: str = Field(min_length=1)
    """Name of the EPDDeployment this bundle belongs to."""
    namespace: str = "default"
    role: Role
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment for the process (user-supplied); never overrides a variable the launcher owns."""
    master: MasterConfig | None = None
    store_client: StoreClientConfig | None = None
    mooncake: MooncakeStoreConfig | None = None
    """The vLLM-side Mooncake JSON, written to a file named by MOONCAKE_CONFIG_PATH."""
    vllm: VllmServerConfig | None = None
    ec_transfer: ECTransferConfig | None = None
    kv_transfer: KVTransferConfig | None = None
    proxy: ProxySettings | None = None
    peers: Peers = Field(default_factory=Peers)
    wait: WaitSettings = Field(default_factory=WaitSettings)

    @model_validator(mode="after")
    def _sections_match_role(self) -> RoleBundle:
        problems = role_section_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def to_json(self) -> str:
        """The file the operator writes into the role's ConfigMap (stable key order, aliases)."""
        return json.dumps(self.model_dump(mode="json", by_alias=True, exclude_none=True), indent=2, sort_keys=True)


def parse_bundle(text: str, *, source: str = "bundle") -> RoleBundle:
    """A validated bundle from its JSON text, or ConfigError with one line per problem."""
    try:
        data: Any = json.loads(text)
    except ValueError as exc:
        raise ConfigError([f"{source}: not valid JSON ({exc}). Fix: give the file the operator rendered"]) from exc
    try:
        return RoleBundle.model_validate(data)
    except ValidationError as exc:
        raise ConfigError([f"{source}: {line}" for line in describe_validation_error(exc)]) from exc


def load_bundle(path: Path) -> RoleBundle:
    """Read and validate a bundle file; every problem becomes a ConfigError line naming the field."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            [f"--bundle {str(path)!r}: cannot read ({exc.strerror}). Fix: mount the role's bundle ConfigMap there"]
        ) from exc
    return parse_bundle(text, source=str(path))


def bundle_json_schema() -> dict[str, Any]:
    """The exported JSON schema of the bundle; the operator's rendering is tested against it."""
    return RoleBundle.model_json_schema(by_alias=True)
