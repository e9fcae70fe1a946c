"""The EPDDeployment spec: what a user writes (the model and the store have modules of their own). Defaults and
rules live next to the fields: each model's RULES are rows of `api._rules.Rule`, CEL and Python side by side.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator

from epd_connectors.config.base import Port
from epd_connectors.config.media import HOST_NAME, MediaAccess
from epd_connectors.config.vllm import VllmVersion
from epd_operator.api import kube as k
from epd_operator.api._base import ApiModel, EnvMap, LabelMap, NodePath, PositiveQuantity, Resources
from epd_operator.api._rules import Rule, RuledModel
from epd_operator.api.autoscaling import AutoscalingSpec
from epd_operator.api.model import HostPathSource, ModelSpec, PvcSource
from epd_operator.api.store import StoreSpec


class Images(ApiModel):
    """Container images per component; unset ones come from the operator's defaults (Helm values)."""

    vllm: str | None = Field(default=None, min_length=1, max_length=k.STRING_MAX, pattern=k.IMAGE)
    """Image for encoder, prefill and decode (vLLM + epd-connectors)."""
    proxy: str | None = Field(default=None, min_length=1, max_length=k.STRING_MAX, pattern=k.IMAGE)
    """Image for the proxy (epd-connectors)."""
    mooncake: str | None = Field(default=None, min_length=1, max_length=k.STRING_MAX, pattern=k.IMAGE)
    """Image for the Mooncake master and store clients."""
    vllm_version: VllmVersion | None = None
    """The vLLM minor version the vllm image runs (0.32, 0.33 or 0.34): what is rendered for it. Unset: the
    operator's default (the default image's, 0.33). Part of the model revision and of the cache prefixes, so a
    change rolls every vLLM role as a model change does, and two versions never share cache entries."""


class SharedStorageSpec(RuledModel):
    """A volume every encoder and consumer mounts, for the shared-storage (example) connectors."""

    RULES: ClassVar[tuple[Rule[SharedStorageSpec], ...]] = (
        Rule(
            "spec.sharedStorage",
            lambda s: (s.pvc is None) != (s.host_path is None),
            lambda s: "pvc/hostPath",
            "needs exactly one volume",
            "give pvc or hostPath",
            cel="[has(self.pvc), has(self.hostPath)].filter(x, x).size() == 1",
            cel_message="spec.sharedStorage: give pvc or hostPath",
        ),
    )

    pvc: PvcSource | None = None
    """A ReadWriteMany claim."""
    host_path: HostPathSource | None = None
    """A node directory (single node only)."""


class CrossEncoderCacheSpec(ApiModel):
    """Encoders publish their outputs to the store and reuse each other's (needs Model Runner V2)."""

    enabled: bool = False
    """Turn reuse on."""
    prefix: str | None = Field(default=None, max_length=k.STRING_MAX, pattern=r"^[^@\s]+$")
    """Override of the derived embedding cache prefix."""
    max_pending_items: int = Field(default=32, gt=0, le=k.INT32_MAX)
    """Publishes in flight per encoder."""
    max_pending_bytes: PositiveQuantity = 2 * 1024**3
    """Bytes of publishes in flight per encoder."""
    read_buffer_bytes: PositiveQuantity = 128 * 1024**2
    """Buffer for reading a shared embedding."""


class _RoleCommon(ApiModel):
    replicas: int = Field(default=1, ge=0, le=k.REPLICAS_MAX)
    """Instances of this role (not used with autoscaling)."""
    autoscaling: AutoscalingSpec | None = None
    """Let the role's load set its replicas (KEDA or an HPA) between bounds."""
    resources: Resources = Resources()
    """Container resources; the GPU count is set from the tensor parallel size."""
    extra_args: list[Annotated[str, Field(max_length=k.STRING_MAX)]] = Field(default=[], max_length=k.MAP_MAX)
    """Further vLLM arguments (may not set a flag the operator owns)."""
    max_num_batched_tokens: int | None = Field(default=None, ge=1, le=k.INT32_MAX)
    """vLLM --max-num-batched-tokens (the scheduler's token budget per step); vLLM's default when unset,
    effectively unlimited on encoders."""
    enforce_eager: bool | None = None
    """vLLM --enforce-eager (no CUDA graphs); vLLM's default when unset. Encoders always run eager."""
    env: EnvMap = {}
    """Extra environment variables."""
    node_selector: LabelMap = {}
    """Nodes for this role."""
    max_surge: int = Field(default=0, ge=0, le=k.REPLICAS_MAX)
    """Pods a rollout may add before it removes old ones. 0 (default: GPUs are usually all allocated) replaces
    one pod at a time, so a one-replica role is briefly down; with spare GPUs, 1 or more keeps capacity."""


class EncoderSpec(_RoleCommon):
    """Encoder instances: run only the multimodal encoder and hand embeddings to prefill/PD."""

    tensor_parallel_size: int = Field(default=1, ge=1, le=k.TENSOR_PARALLEL_MAX)
    """Must be 1 with the Mooncake EC connector."""
    connector: Literal["mooncake", "shared-storage"] = "mooncake"
    """ECMooncakeConnector (transfer engine, needs no shared disk) or ECExampleConnector (sharedStorage)."""
    buffer_device: Literal["cuda", "cpu"] = "cuda"
    """Where the EC transfer buffer lives."""
    buffer_size: PositiveQuantity = 1_000_000_000
    """Bytes of the EC transfer buffer each encoder and consumer registers (ECMooncakeConnector's
    ec_buffer_size, vLLM's default 1e9); it must hold the embeddings in flight at once."""
    cross_encoder_cache: CrossEncoderCacheSpec = CrossEncoderCacheSpec()
    """Reuse of encoder outputs across encoders."""

    @property
    def pushes_embeddings(self) -> bool:
        """ECMooncakeConnector: encoders push embeddings to each consumer's EC control port."""
        return self.connector == "mooncake"

    @property
    def uses_shared_storage(self) -> bool:
        """ECExampleConnector: embeddings go through a folder of spec.sharedStorage."""
        return self.connector == "shared-storage"


KVConnector = Literal["mooncake", "mooncake-store", "mooncake+store", "shared-storage"]


class PrefillKVSpec(RuledModel):
    """How KV moves from prefill to decode."""

    RULES: ClassVar[tuple[Rule[PrefillKVSpec], ...]] = (
        Rule(
            ".leaseDurationSeconds",
            lambda kv: kv.lease_duration_seconds is None or kv.uses_p2p,
            lambda kv: kv.lease_duration_seconds,
            "is MooncakeConnector's (P2P)",
            "remove it, or use connector mooncake or mooncake+store",
            cel="!has(self.leaseDurationSeconds) || self.connector == 'mooncake' || self.connector == 'mooncake+store'",
        ),
    )

    connector: KVConnector = "mooncake"
    """mooncake: P2P MooncakeConnector; mooncake-store: through the store (MooncakeStoreConnector);
    mooncake+store: both (MultiConnector, shared prefix cache); shared-storage: ExampleConnector."""
    load_async: bool = True
    """MooncakeStoreConnector: load KV asynchronously."""
    lookup_async: bool = False
    """MooncakeStoreConnector: look up the store asynchronously."""
    lease_duration_seconds: float | None = Field(default=None, gt=0, le=3600)
    """vLLM 0.34 only, MooncakeConnector (mooncake, mooncake+store): seconds a prefill holds a request's KV blocks
    for its decode, renewed while the decode is alive (kv_lease_duration, set alike on both); unset: no leases,
    blocks are freed after 480 s."""

    @property
    def uses_store(self) -> bool:
        """MooncakeStoreConnector moves KV through the store (alone or beside P2P)."""
        return self.connector in ("mooncake-store", "mooncake+store")

    @property
    def uses_p2p(self) -> bool:
        """MooncakeConnector hands KV over from prefill to decode (alone or beside the store)."""
        return self.connector in ("mooncake", "mooncake+store")

    @property
    def uses_shared_storage(self) -> bool:
        """ExampleConnector: KV goes through a folder of spec.sharedStorage."""
        return self.connector == "shared-storage"


_RESERVED = "[" + ", ".join(f"'{n}'" for n in k.RESERVED_POOL_NAMES) + "]"
_POOL_NAME_FIX = (
    f"one word of lowercase letters and digits starting with a letter, at most {k.POOL_NAME_MAX} characters, "
    f"not one of {', '.join(k.RESERVED_POOL_NAMES)} (e.g. tp2)"
)


class PrefillPoolSpec(ApiModel):
    """One more prefill pool, with its own TP size."""

    # CEL of the field validator below, which stays a field rule so its message names the pool's index.
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"!(self.name in {_RESERVED})",
                    "message": f"spec.prefill.additionalPools[].name: reserved. Fix: {_POOL_NAME_FIX}",
                }
            ]
        }
    )

    name: str = Field(max_length=k.POOL_NAME_MAX, pattern=k.POOL_NAME)
    """Suffix of the pool's objects (<deployment>-prefill-<name>): one word of lowercase letters and digits
    starting with a letter, at most 15 characters, not a reserved word (master, store, encoder, prefill,
    decode, pd, proxy, bundle, main, client)."""
    replicas: int = Field(default=1, ge=0, le=k.REPLICAS_MAX)
    """Instances in this pool (not used with autoscaling)."""
    autoscaling: AutoscalingSpec | None = None
    """Let the pool's load set its replicas between bounds."""
    tensor_parallel_size: int = Field(ge=1, le=k.TENSOR_PARALLEL_MAX)
    """GPUs per instance of this pool."""

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name in k.RESERVED_POOL_NAMES:
            raise ValueError(f"{name!r} is reserved (a word of other child names). Fix: {_POOL_NAME_FIX}")
        return name


class PrefillSpec(_RoleCommon):
    """A prefill pool; omit it to run combined prefill+decode (PD) instances."""

    tensor_parallel_size: int = Field(default=1, ge=1, le=k.TENSOR_PARALLEL_MAX)
    """GPUs per prefill instance."""
    additional_pools: Annotated[
        list[PrefillPoolSpec],
        # The API server refuses two pools of one name (a list keyed by name).
        Field(
            max_length=k.POOLS_MAX,
            json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        ),
    ] = []
    """More prefill pools with other TP sizes (mixed prefill TP); the store TP is the LCM of every pool's TP."""
    kv: PrefillKVSpec | None = None
    """The KV connector (required with a prefill pool)."""


class DecodeKVSpec(ApiModel):
    """Decode-side KV settings."""

    save_decode_cache: bool = False
    """MooncakeStoreConnector: also store the blocks decode produces."""
    store_offload: bool = False
    """Without a prefill pool: offload PD's KV cache to the store (MooncakeStoreConnector kv_both)."""
    load_failure_policy: Literal["recompute", "fail"] = "recompute"
    """When a KV load fails (vLLM's kv_load_failure_policy): "recompute" (default) computes the failed blocks
    locally, same output at some latency; "fail" ends the request with an error. Applies to every instance
    that loads KV."""


class DecodeSpec(_RoleCommon):
    """Decode instances (or combined PD instances when there is no prefill pool)."""

    tensor_parallel_size: int = Field(default=1, ge=1, le=k.TENSOR_PARALLEL_MAX)
    """GPUs per decode instance."""
    kv: DecodeKVSpec = DecodeKVSpec()
    """KV settings."""


class ProxyServiceSpec(ApiModel):
    """The Service in front of the proxy."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    """Service type."""
    port: Port = 8000
    """Port clients call (OpenAI-compatible API)."""


class ProxyRoutingSpec(ApiModel):
    """Request routing."""

    encoder_affinity: bool = True
    """Send a repeated image to the encoder that already holds it."""


class TransferCheckSpec(ApiModel):
    """Canaries: the proxy proves each transfer path it routes (encoder -> EC consumer, prefill -> decode) with a
    tiny request through the real backends, and keeps failing pairs out of routing; TransferReady reports them."""

    enabled: bool = True
    """Send canaries; false: every path counts as working (TransferReady says it is not checked)."""
    interval_seconds: int = Field(default=60, ge=5, le=3600)
    """Seconds between canaries of a path that works (a failing one is retried from 5 s on)."""
    timeout_seconds: int = Field(default=30, ge=1, le=600)
    """Seconds one canary may take before its path counts as failing; below the consumers' push_wait_timeout_s
    (60 s) finds a broken push sooner."""
    required_for_ready: bool = True
    """Ready needs TransferReady; false: TransferReady is reported but Ready does not wait for it."""


class ProxySpec(ApiModel):
    """The E/P/D request proxy."""

    replicas: int = Field(default=1, ge=0, le=k.REPLICAS_MAX)
    """Proxy instances."""
    service: ProxyServiceSpec = ProxyServiceSpec()
    """Its Service."""
    routing: ProxyRoutingSpec = ProxyRoutingSpec()
    """Routing switches."""
    transfer_check: TransferCheckSpec = TransferCheckSpec()
    """Canaries over each transfer path, and whether Ready waits for them."""
    resources: Resources = Resources()
    """The proxy's resources (1 CPU and 1 GiB requested when empty)."""
    node_selector: LabelMap = {}
    """Nodes for the proxy (e.g. CPU nodes beside the GPU pool)."""


ANY_DOMAIN = "*"
"""spec.media.allowedDomains entry for "any host" (vLLM without an allow-list)."""
_DOMAIN = rf"^(\{ANY_DOMAIN}|{HOST_NAME.pattern[1:-1]})$"


class MediaSpec(RuledModel):
    """The media URLs the deployment's vLLM instances fetch besides inline (base64 data URL) media. vLLM fetches
    an http(s) URL from inside the cluster, so by default it fetches none: list the hosts it may fetch from. The
    proxy refuses any other URL with 400 before a backend sees it."""

    RULES: ClassVar[tuple[Rule[MediaSpec], ...]] = (
        Rule(
            "spec.media.allowedDomains",
            lambda s: ANY_DOMAIN not in s.allowed_domains or len(s.allowed_domains) == 1,
            lambda s: s.allowed_domains,
            f"'{ANY_DOMAIN}' (any host) stands alone",
            f"list hosts, or give only '{ANY_DOMAIN}'",
            # has(): the API server checks the rule on the field's `{}` default before nested defaults fill it.
            cel=f"!has(self.allowedDomains) || !self.allowedDomains.exists(d, d == '{ANY_DOMAIN}') "
            "|| self.allowedDomains.size() == 1",
        ),
        Rule(
            "spec.media.allowedLocalMediaPath",
            lambda s: s.allowed_local_media_path is None or s.allowed_local_media_path.strip("/") != "",
            lambda s: s.allowed_local_media_path,
            "would let media URLs read every file of the container",
            "name the directory of the media, e.g. /media",
            cel="!has(self.allowedLocalMediaPath) || self.allowedLocalMediaPath.matches('[^/]')",
        ),
    )

    allowed_domains: list[Annotated[str, Field(max_length=253, pattern=_DOMAIN)]] = Field(
        default=[], max_length=k.MAP_MAX
    )
    """Hosts http(s) media URLs may name, exactly as written (vLLM --allowed-media-domains matches whole lower-case
    host names, no wildcards); ["*"]: any host, including the cluster's own. Empty (the default): none."""
    allowed_local_media_path: NodePath | None = None
    """A directory in the vLLM containers whose files file:// media URLs may name (vLLM
    --allowed-local-media-path); unset: no local files."""

    @property
    def access(self) -> MediaAccess:
        domains = None if self.allowed_domains == [ANY_DOMAIN] else tuple(self.allowed_domains)
        return MediaAccess(domains=domains, local_path=self.allowed_local_media_path)


_STORE = "needs a Mooncake store"
_SERVING_AT_ZERO = "only encoders may go to 0 (the language model serves every request)"


class EPDDeploymentSpec(RuledModel):
    """One encoder-disaggregated multimodal deployment: encoders, prefill and decode (or PD), proxy, store."""

    RULES: ClassVar[tuple[Rule[EPDDeploymentSpec], ...]] = (
        Rule(
            "spec.encoder.crossEncoderCache.enabled",
            lambda s: not s.encoder.cross_encoder_cache.enabled or s.store is not None,
            lambda s: True,
            _STORE,
            "add spec.store",
            cel="!self.encoder.crossEncoderCache.enabled || has(self.store)",
            cel_message="spec.encoder.crossEncoderCache: cross-encoder reuse needs a Mooncake store; add spec.store",
        ),
        Rule(
            "spec.store.clients.offload.enabled",
            lambda s: (
                not s.encoder.cross_encoder_cache.enabled or s.store is None or not s.store.clients.offload.enabled
            ),
            lambda s: True,
            "cross-encoder reuse needs a RAM-only store",
            "disable offload",
            cel="!self.encoder.crossEncoderCache.enabled || !has(self.store) || !self.store.clients.offload.enabled",
        ),
        # No CEL: a deployment the API server admits and render refuses shows in the Valid condition.
        Rule(
            "spec.model.mmProcessorCacheGB",
            lambda s: not s.encoder.cross_encoder_cache.enabled or s.model.mm_processor_cache_gb > 0,
            lambda s: s.model.mm_processor_cache_gb,
            "cross-encoder reuse needs the processor cache",
            "set it above 0",
        ),
        Rule(
            "spec.encoder.connector",
            lambda s: not s.encoder.cross_encoder_cache.enabled or s.encoder.pushes_embeddings,
            lambda s: s.encoder.connector,
            "cross-encoder reuse needs the Mooncake EC connector",
            "use connector: mooncake",
            cel="!self.encoder.crossEncoderCache.enabled || self.encoder.connector == 'mooncake'",
            cel_message="spec.encoder.connector: cross-encoder reuse needs the Mooncake EC connector; "
            "use connector: mooncake",
        ),
        Rule(
            "spec.encoder.tensorParallelSize",
            lambda s: not s.encoder.pushes_embeddings or s.encoder.tensor_parallel_size == 1,
            lambda s: s.encoder.tensor_parallel_size,
            "the Mooncake EC connector needs encoder TP 1",
            "scale encoders by replicas",
            cel="self.encoder.connector != 'mooncake' || self.encoder.tensorParallelSize == 1",
            cel_message="spec.encoder.tensorParallelSize: the Mooncake EC connector needs encoder TP 1; "
            "scale by replicas",
        ),
        Rule(
            "spec.prefill.kv",
            lambda s: s.prefill is None or s.prefill.kv is not None,
            lambda s: None,
            "a prefill pool needs a KV connector",
            "set spec.prefill.kv.connector",
            cel="!has(self.prefill) || has(self.prefill.kv)",
        ),
        Rule(
            "spec.prefill.kv.connector",
            lambda s: s.prefill_kv is None or not s.prefill_kv.uses_store or s.store is not None,
            lambda s: s.prefill_kv.connector if s.prefill_kv else None,
            _STORE,
            "add spec.store",
            cel="!has(self.prefill) || !has(self.prefill.kv) || !self.prefill.kv.connector.contains('store') "
            "|| has(self.store)",
            cel_message="spec.prefill.kv.connector: the store KV connectors need spec.store",
        ),
        Rule(
            "spec.decode.kv.storeOffload",
            lambda s: s.prefill is None or not s.decode.kv.store_offload,
            lambda s: True,
            "applies to combined PD only",
            "remove it, or remove spec.prefill",
        ),
        Rule(
            "spec.decode.kv.storeOffload",
            lambda s: not s.decode.kv.store_offload or s.store is not None,
            lambda s: True,
            _STORE,
            "add spec.store",
        ),
        Rule(
            "spec.sharedStorage",
            lambda s: not s.uses_shared_storage or s.shared_storage is not None,
            lambda s: None,
            "the shared-storage connectors need a shared volume",
            "set spec.sharedStorage",
            cel="(self.encoder.connector != 'shared-storage' && (!has(self.prefill) || !has(self.prefill.kv) "
            "|| self.prefill.kv.connector != 'shared-storage')) || has(self.sharedStorage)",
        ),
        Rule(
            "spec.prefill.autoscaling.minReplicas",
            lambda s: s.prefill is None or s.prefill.autoscaling is None or s.prefill.autoscaling.min_replicas > 0,
            lambda s: 0,
            _SERVING_AT_ZERO,
            "give 1 or more",
            cel="!has(self.prefill) || !has(self.prefill.autoscaling) || self.prefill.autoscaling.minReplicas > 0",
        ),
        Rule(
            "spec.prefill.additionalPools[].autoscaling.minReplicas",
            lambda s: (
                s.prefill is None
                or all(p.autoscaling is None or p.autoscaling.min_replicas > 0 for p in s.prefill.additional_pools)
            ),
            lambda s: 0,
            _SERVING_AT_ZERO,
            "give 1 or more",
            cel="!has(self.prefill) || !has(self.prefill.additionalPools) || self.prefill.additionalPools.all(p, "
            "!has(p.autoscaling) || p.autoscaling.minReplicas > 0)",
        ),
        Rule(
            "spec.decode.autoscaling.minReplicas",
            lambda s: s.decode.autoscaling is None or s.decode.autoscaling.min_replicas > 0,
            lambda s: 0,
            _SERVING_AT_ZERO,
            "give 1 or more",
            cel="!has(self.decode.autoscaling) || self.decode.autoscaling.minReplicas > 0",
        ),
    )

    model: ModelSpec
    """The model."""
    images: Images = Images()
    """Images (operator defaults when unset)."""
    store: StoreSpec | None = None
    """The Mooncake store; omit for shared-storage-only setups."""
    shared_storage: SharedStorageSpec | None = None
    """Shared volume for the shared-storage connectors."""
    encoder: EncoderSpec = EncoderSpec()
    """Encoders."""
    prefill: PrefillSpec | None = None
    """Prefill pool; omit to run combined PD instances."""
    decode: DecodeSpec = DecodeSpec()
    """Decode (or PD) instances."""
    proxy: ProxySpec = ProxySpec()
    """The proxy."""
    media: MediaSpec = MediaSpec()
    """The media URLs the deployment fetches (by default none: media come inline)."""

    @property
    def prefill_kv(self) -> PrefillKVSpec | None:
        """The KV connector between prefill and decode; None for combined PD."""
        return self.prefill.kv if self.prefill is not None else None

    @property
    def store_kv_split(self) -> bool:
        """Prefill and decode exchange KV through the store (mooncake-store or mooncake+store)."""
        return self.prefill_kv is not None and self.prefill_kv.uses_store

    @property
    def p2p_kv(self) -> bool:
        """Prefill and decode run MooncakeConnector (and so the prefill's bootstrap server)."""
        return self.prefill_kv is not None and self.prefill_kv.uses_p2p

    @property
    def uses_kv_store(self) -> bool:
        """Some role keeps KV in the store: a store split, or combined PD offloading to it."""
        return self.store_kv_split or (self.prefill is None and self.decode.kv.store_offload)

    @property
    def uses_shared_storage(self) -> bool:
        """An EC or KV shared-storage connector moves data through spec.sharedStorage."""
        kv_shared = self.prefill_kv is not None and self.prefill_kv.uses_shared_storage
        return self.encoder.uses_shared_storage or kv_shared
