"""The per-role bundle: everything one pod needs, in one versioned document.

The operator renders one bundle per role into a ConfigMap; `epd-launch` reads it in the pod. Keeping the whole
runtime contract in one typed file means the launcher never has to guess, and the operator and the launcher can
be checked against the same JSON schema (`bundle_json_schema`). The rules that decide whether a bundle's
sections fit its role follow the models as one flat list: each returns the message of the rule it enforces
(field, value, fix) or nothing.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import Field, ValidationError, model_validator

from epd_connectors.config.base import ConfigError, ConfigModel, Port, address, describe_validation_error, problem
from epd_connectors.config.ec_ports import ec_control_address
from epd_connectors.config.ec_transfer import ECMooncakeProducer, ECTransferConfig
from epd_connectors.config.kv_transfer import KVTransferConfig, MooncakeStoreConnectorConfig, connectors_of
from epd_connectors.config.master import MasterConfig
from epd_connectors.config.media import MediaAccess
from epd_connectors.config.mooncake import MooncakeStoreConfig, StoreMode
from epd_connectors.config.roles import Role
from epd_connectors.config.store_client import StoreClientConfig
from epd_connectors.config.transfer_rules import check_transfers
from epd_connectors.config.vllm import VllmServerConfig

BUNDLE_API_VERSION: Literal["epd.serving.io/v1alpha1"] = "epd.serving.io/v1alpha1"
BUNDLE_KIND: Literal["RoleBundle"] = "RoleBundle"


POD_IP_PLACEHOLDER: Literal["pod-ip.invalid"] = "pod-ip.invalid"
"""Host written into a bundle where only the pod knows the value (a store client's host, an EC consumer's ec_ip,
an HA master's rpc_address): epd-launch replaces it with POD_IP from the downward API. The .invalid TLD
(RFC 2606) never resolves, so an address that was not replaced fails loudly instead of pointing elsewhere."""

POD_IP_ENV: Final = "POD_IP"
"""Set from the downward API in every pod: the address this process advertises to its peers."""
WORKDIR_ENV: Final = "EPD_WORKDIR"
"""Where epd-launch writes the files it derives from the bundle (the pod's work volume)."""
DEPLOYMENT_LABEL: Final = "epd.serving.io/deployment"
"""On every pod of a deployment (value: the EPDDeployment's name); the proxy selects the model pods by it."""
MODEL_REVISION_LABEL: Final = "epd.serving.io/model-revision"
"""On encoder, prefill, decode and PD pods: a hash of the model identity and weights location; the proxy pairs
only pods of one value (the operator's status.modelRevision names the current one)."""


class Endpoint(ConfigModel):
    """A host and port another role listens on."""

    host: str = Field(min_length=1)
    """DNS name (a Service or pod name in a cluster) or IP address."""
    port: Port

    def url(self, scheme: str = "http") -> str:
        return address(scheme, self.host, self.port)


class ECControl(ConfigModel):
    """Where the pods behind a consumer endpoint take pushed embeddings (ECMooncakeConnector): their EC config's
    ec_port and parallel sizes, which place every rank's control port (ec_ports)."""

    port: Port
    """The consumer's ec_port: TP rank 0 of DP replica 0."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    data_parallel_size: int = Field(default=1, ge=1)

    def addresses(self, host: str) -> list[str]:
        """The control address an encoder pushes to, one per DP replica, for a pod at `host`."""
        return [
            ec_control_address(host, self.port, self.tensor_parallel_size, d) for d in range(self.data_parallel_size)
        ]


class ConsumerEndpoint(Endpoint):
    """A language-model endpoint that may take encoder output (pd, or prefill in a split)."""

    ec: ECControl | None = None
    """How to address its pods' EC control ports; None when no encoder pushes to it."""


class PrefillEndpoint(ConsumerEndpoint):
    """A prefill endpoint: an EC consumer, and with MooncakeConnector the decode's KV source."""

    bootstrap_port: Port | None = None
    """MooncakeConnector's bootstrap server (VLLM_MOONCAKE_BOOTSTRAP_PORT) on its pods; None without it."""


class Peers(ConfigModel):
    """Where the other roles of this deployment are; the proxy's static roster and every role's waits."""

    master_health_url: str | None = None
    """The Mooncake master's JSON health endpoint; every store user waits for it before starting."""
    master_metrics_url: str | None = None
    """The master's Prometheus metrics; in standalone-store mode encoders wait for mounted capacity here."""
    encoders: list[Endpoint] = Field(default_factory=list)
    prefill: list[PrefillEndpoint] = Field(default_factory=list)
    decode: list[Endpoint] = Field(default_factory=list)
    pd: list[ConsumerEndpoint] = Field(default_factory=list)
    ec_consumers: list[str] = Field(default_factory=list)
    """EC control addresses (tcp://host:port) of every consumer replica, in consumer order, given instead of
    the consumers' `ec` (a roster written by hand)."""

    @property
    def consumers(self) -> list[PrefillEndpoint] | list[ConsumerEndpoint]:
        """The endpoints that receive encoder output: the prefill endpoints of a split, else the pd ones."""
        return self.prefill if self.prefill else self.pd

    def ec_per_consumer(self) -> list[list[str]]:
        """Each consumer's EC control addresses (one per DP replica) at its own host, from its `ec`."""
        return [e.ec.addresses(e.host) for e in self.consumers if e.ec is not None]

    def ec_addresses(self) -> list[str]:
        """Every consumer replica's EC control address at the endpoints' own hosts, in consumer order."""
        if self.ec_consumers:
            return list(self.ec_consumers)
        return [a for addresses in self.ec_per_consumer() for a in addresses]


PROXY_READINESS_PATH: Final = "/health"
"""200 only when every required role has a healthy instance."""
PROXY_LIVENESS_PATH: Final = "/livez"
"""200 while the proxy serves at all: a liveness probe must not restart it while vLLM is still loading."""


class KVProtocol(StrEnum):
    """How the proxy hands the KV cache from prefill to decode.

    `passive`: connectors that find the KV by content (ExampleConnector, MooncakeStoreConnector); the decode is
    sent after the prefill answers, with the prefill's kv_transfer_params if it returned any.
    `mooncake`: MooncakeConnector P2P; the proxy asks the prefill's bootstrap server for its engine id and
    builds both sides' kv_transfer_params with one transfer id.
    """

    PASSIVE = "passive"
    MOONCAKE = "mooncake"


CanaryMedia = Literal["image", "audio"]
"""What an encoder-to-consumer canary carries: an image, or an audio clip for a model that takes no images."""


class ProxySettings(ConfigModel):
    """The request proxy's own listener and routing switches."""

    host: str = "0.0.0.0"
    port: Port = 8000
    encoder_affinity: bool = True
    """Route a media item by the hash of its content to the encoder that already holds its embedding."""
    kv_protocol: KVProtocol = KVProtocol.PASSIVE
    """How prefill hands its KV cache to decode; `mooncake` needs every prefill endpoint's bootstrap_port."""
    discover: bool = False
    """Follow the peers' Services' EndpointSlices for their pods (a cluster); false: use the peers as given."""
    canary_interval_s: float | None = Field(default=None, ge=0)
    """Seconds between canaries of each transfer path that works; 0: none (None: the proxy's default)."""
    canary_timeout_s: float | None = Field(default=None, gt=0)
    """Seconds one canary may take before its path counts as failing (None: the proxy's default)."""
    canary_media: CanaryMedia | None = None
    """What an EC canary sends (None: an image); an audio-only model (Qwen2-Audio) refuses an image."""
    media: MediaAccess = MediaAccess()
    """The media URLs the deployment's instances fetch: the proxy refuses any other before a backend sees it."""
    encoder_wake_s: float = Field(default=0.0, ge=0)
    """Encoders may be scaled to zero: the proxy is ready without them, and holds a media request up to this many
    seconds for one to come (counted in epd_proxy_requests_waiting, which wakes them); 0: encoders are required,
    and a media request finding none is answered 503 at once."""


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
        problems = _role_section_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def to_json(self) -> str:
        """The file the operator writes into the role's ConfigMap (stable key order, aliases)."""
        return json.dumps(self.model_dump(mode="json", by_alias=True, exclude_none=True), indent=2, sort_keys=True)


# Which sections each role may carry; anything else must be absent, so a bundle can't half-configure a role.
_SECTIONS = ("master", "store_client", "mooncake", "vllm", "ec_transfer", "kv_transfer", "proxy")
_ALLOWED: dict[Role, frozenset[str]] = {
    Role.MASTER: frozenset({"master"}),
    Role.STORE_CLIENT: frozenset({"store_client"}),
    Role.ENCODER: frozenset({"vllm", "ec_transfer", "mooncake"}),
    Role.PREFILL: frozenset({"vllm", "ec_transfer", "kv_transfer", "mooncake"}),
    Role.DECODE: frozenset({"vllm", "kv_transfer", "mooncake"}),
    Role.PD: frozenset({"vllm", "ec_transfer", "kv_transfer", "mooncake"}),
    Role.PROXY: frozenset({"proxy"}),
}
_REQUIRED: dict[Role, str] = {
    Role.MASTER: "master",
    Role.STORE_CLIENT: "store_client",
    Role.ENCODER: "vllm",
    Role.PREFILL: "vllm",
    Role.DECODE: "vllm",
    Role.PD: "vllm",
    Role.PROXY: "proxy",
}
# Set by the launcher from typed sections; a user env entry must not fight them.
_OWNED_ENV = (
    "MOONCAKE_CONFIG_PATH",
    "PYTHONHASHSEED",
    "VLLM_USE_V2_MODEL_RUNNER",
    "VLLM_MOONCAKE_BOOTSTRAP_PORT",
    "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH",
)


def _role_section_problems(bundle: RoleBundle) -> list[str]:
    """Every problem with the bundle as a whole, one message each; empty when it can be launched."""
    role = bundle.role
    found: list[str] = []
    for section in _SECTIONS:
        present = getattr(bundle, section) is not None
        if present and section not in _ALLOWED[role]:
            found.append(problem(section, "set", f"a {role} bundle does not use it", f"remove {section}"))
    required = _REQUIRED[role]
    if getattr(bundle, required) is None:
        found.append(problem(required, None, f"a {role} bundle needs it", f"give the {required} section"))
    for name in _OWNED_ENV:
        if name in bundle.env:
            found.append(
                problem(
                    f"env.{name}",
                    bundle.env[name],
                    "is set by epd-launch from the bundle's typed sections",
                    "remove it from env and set the corresponding field",
                )
            )
    if found:
        return found
    found += _store_client_problems(bundle)
    found += _vllm_problems(bundle)
    found += _proxy_problems(bundle)
    return found


def _store_client_problems(bundle: RoleBundle) -> list[str]:
    if bundle.store_client is None or bundle.peers.master_health_url:
        return []
    return [_no_master_health_url("a store client")]


def _no_master_health_url(who: str) -> str:
    return problem(
        "peers.master_health_url",
        None,
        f"{who} must wait for the master (setup() blocks ~90 s without one)",
        "give the master's http://HOST:METRICS_PORT/health",
    )


def needs_store(ec: ECTransferConfig | None, kv: KVTransferConfig | None) -> bool:
    """Whether a vLLM process with these connectors talks to the Mooncake store (and so needs its JSON and the
    master): cross-encoder reuse on an encoder, or MooncakeStoreConnector anywhere in its KV config."""
    cross_encoder = isinstance(ec, ECMooncakeProducer) and ec.ec_connector_extra_config.cross_encoder_cache
    store_kv = kv is not None and any(isinstance(c, MooncakeStoreConnectorConfig) for c in connectors_of(kv))
    return bool(cross_encoder or store_kv)


def _vllm_problems(bundle: RoleBundle) -> list[str]:
    server = bundle.vllm
    if server is None:
        return []
    found: list[str] = []
    if server.role != bundle.role:
        found.append(
            problem("vllm.role", server.role, f"differs from the bundle's role {bundle.role}", "make them equal")
        )
    mooncake = bundle.mooncake
    store_offload = mooncake.enable_offload if mooncake is not None else None
    found += check_transfers(server, bundle.ec_transfer, bundle.kv_transfer, store_offload=store_offload)
    if mooncake is None:
        return found
    if not needs_store(bundle.ec_transfer, bundle.kv_transfer):
        found.append(
            problem(
                "mooncake",
                "set",
                "no connector of this role uses the Mooncake store",
                "remove mooncake, or enable MooncakeStoreConnector or cross_encoder_cache",
            )
        )
    if not bundle.peers.master_health_url:
        found.append(_no_master_health_url("a store user"))
    standalone = mooncake.mode is StoreMode.STANDALONE_STORE
    if bundle.role == Role.ENCODER and standalone and not bundle.peers.master_metrics_url:
        found.append(
            problem(
                "peers.master_metrics_url",
                None,
                "encoders of a standalone store wait until a store client has mounted its segment",
                "give the master's http://HOST:METRICS_PORT/metrics",
            )
        )
    return found


def _proxy_problems(bundle: RoleBundle) -> list[str]:
    proxy = bundle.proxy
    if proxy is None:
        return []
    peers = bundle.peers
    # A decode (kv_consumer) is only half a split: alone it has no prefill to take KV from.
    if not (peers.pd or (peers.prefill and peers.decode)):
        given = [name for name in ("prefill", "decode") if getattr(peers, name)]
        return [
            problem(
                "peers",
                f"only {' and '.join(given)}" if given else "no language-model instances",
                "the proxy needs pd, or prefill and decode together (a split)",
                "list the pd endpoints, or the prefill and decode endpoints",
            )
        ]
    found: list[str] = []
    kind = "prefill" if peers.prefill else "pd"
    with_ec = [i for i, e in enumerate(peers.consumers) if e.ec is not None]
    if with_ec and len(with_ec) != len(peers.consumers):
        found.append(
            problem(
                f"peers.{kind}[*].ec",
                f"set on {with_ec} only",
                "an encoder pushes to every consumer, so the proxy needs every one's control port",
                f"give ec on every {kind} endpoint, or on none",
            )
        )
    if with_ec and peers.ec_consumers:
        found.append(
            problem(
                "peers.ec_consumers",
                peers.ec_consumers,
                f"the {kind} endpoints' ec give the addresses too",
                "give one of them",
            )
        )
    missing = [i for i, e in enumerate(peers.prefill) if e.bootstrap_port is None]
    if proxy.kv_protocol is KVProtocol.MOONCAKE and missing:
        found.append(
            problem(
                "peers.prefill[*].bootstrap_port",
                f"missing on {missing}",
                "with kv_protocol mooncake the proxy asks each prefill's bootstrap server for its engine id",
                "give every prefill endpoint its bootstrap_port (VLLM_MOONCAKE_BOOTSTRAP_PORT)",
            )
        )
    return found


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
