"""The EPDDeployment spec: what a user writes. Defaults and rules live next to the fields.

Rules the API server can check are also attached as CEL (`x-kubernetes-validations`) so `kubectl apply`
refuses them at once; every rule is enforced in Python too (`EPDDeploymentSpec` validators), which is what
sets the Valid condition and what validates examples and Helm values offline.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from epd_connectors.config.base import Port
from epd_operator.api import kube as k
from epd_operator.api._base import ApiModel, EnvMap, LabelMap, NodePath, PositiveQuantity, Quantity, Resources

_ANY_SCALAR = WithJsonSchema({"x-kubernetes-preserve-unknown-fields": True})
"""A JSON scalar of any type (the CRD's structural schema has no union of types)."""


def _cel(*rules: tuple[str, str]) -> ConfigDict:
    """Attach CEL rules (rule, message) to a model's CRD schema."""
    return ConfigDict(json_schema_extra={"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rules]})


def _fail(field: str, value: object, problem: str, fix: str) -> ValueError:
    return ValueError(f"{field} = {value!r}: {problem}. Fix: {fix}")


class PvcSource(ApiModel):
    """A PersistentVolumeClaim holding the weights (mounted read-only)."""

    claim_name: str = Field(min_length=1, max_length=253, pattern=k.DNS_1123_SUBDOMAIN)
    """Name of the claim in the EPDDeployment's namespace."""


class HostPathSource(ApiModel):
    """A directory on every node (for pre-staged weights)."""

    path: NodePath
    """Absolute path on the node."""


class ImageSource(ApiModel):
    """An OCI image holding the weights, mounted as an image volume (Kubernetes 1.33+)."""

    reference: str = Field(min_length=1, max_length=k.STRING_MAX, pattern=k.IMAGE)
    """Image reference, pinned by digest for reproducible prefixes."""
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """When the kubelet pulls the image."""


class ModelSource(ApiModel):
    """Where the weights come from: exactly one of pvc, hostPath, image."""

    model_config = _cel(
        (
            "[has(self.pvc), has(self.hostPath), has(self.image)].filter(x, x).size() == 1",
            "spec.model.source: give exactly one of pvc, hostPath or image",
        )
    )

    pvc: PvcSource | None = None
    """Weights on a PersistentVolumeClaim."""
    host_path: HostPathSource | None = None
    """Weights in a node directory."""
    image: ImageSource | None = None
    """Weights in an OCI image."""

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        given = [n for n, v in (("pvc", self.pvc), ("hostPath", self.host_path), ("image", self.image)) if v]
        if len(given) != 1:
            raise _fail("spec.model.source", given, "needs exactly one source", "give one of pvc, hostPath or image")
        return self


class ModelSpec(ApiModel):
    """The model every role serves; its identity decides the cache prefixes."""

    name: str = Field(min_length=1, max_length=k.STRING_MAX)
    """Model identity, e.g. Qwen/Qwen2-VL-7B-Instruct. Part of every derived cache prefix."""
    revision: str = Field(default="main", min_length=1, max_length=k.STRING_MAX)
    """Weights revision (commit, tag or digest). A new revision gives new cache prefixes, so stale embeddings
    and KV blocks are never reused."""
    served_model_name: str | None = Field(default=None, min_length=1, max_length=k.STRING_MAX)
    """The name clients send in requests; defaults to name."""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """Weights and activation dtype; part of the cache identity."""
    source: ModelSource
    """Where the weights are."""
    path: str = Field(default="", max_length=k.STRING_MAX)
    """Directory of the weights inside the source (relative); vLLM loads /models/<path>."""
    mm_processor_cache_gb: float = Field(default=4.0, ge=0, le=k.SIZE_MAX // 1024**3, alias="mmProcessorCacheGB")
    """GiB of vLLM's multimodal processor cache per instance; cross-encoder reuse needs it above 0."""
    mm_processor_kwargs: dict[str, Annotated[str | int | float | bool, _ANY_SCALAR]] = Field(
        default={}, max_length=k.MAP_MAX
    )
    """vLLM --mm-processor-kwargs (e.g. max_pixels). They change encoder output, so they are part of the
    embedding cache identity."""
    block_size: int | None = Field(default=None, ge=1, le=k.INT32_MAX)
    """KV cache block size in tokens (vLLM --block-size) of every prefill, decode and PD instance; one value for
    all, since KV moves between them in blocks. vLLM's default when unset (the CPU build needs 32)."""


class Images(ApiModel):
    """Container images per component; unset ones come from the operator's defaults (Helm values)."""

    vllm: str | None = Field(default=None, min_length=1, max_length=k.STRING_MAX, pattern=k.IMAGE)
    """Image for encoder, prefill and decode (vLLM + epd-connectors)."""
    proxy: str | None = Field(default=None, min_length=1, max_length=k.STRING_MAX, pattern=k.IMAGE)
    """Image for the proxy (epd-connectors)."""
    mooncake: str | None = Field(default=None, min_length=1, max_length=k.STRING_MAX, pattern=k.IMAGE)
    """Image for the Mooncake master and store clients."""


class MasterSpec(ApiModel):
    """The Mooncake master (the store's metadata service)."""

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

    @model_validator(mode="before")
    @classmethod
    def _no_ha_yet(cls, data: Any) -> Any:
        # Kept out of the CRD until HA masters are built: the API server refuses the unknown field,
        # and offline validation says why rather than "extra inputs are not permitted".
        if isinstance(data, dict) and "ha" in data:
            raise ValueError(
                "spec.store.master.ha: HA masters are not supported yet (they need the pod IP as the master's "
                "rpc_address). Fix: remove spec.store.master.ha (a single master restarts in seconds)"
            )
        return data


class OffloadSpec(ApiModel):
    """The SSD tier under each store client."""

    enabled: bool = False
    """Keep evicted objects on local disk (master, store clients and vLLM JSON are switched together)."""
    size_limit: PositiveQuantity = 100 * 1024**3
    """Disk space per store client."""
    host_path: NodePath | None = None
    """A node directory for the tier; an emptyDir of size_limit when unset."""


class StoreClientsSpec(ApiModel):
    """Standalone store clients: the processes that own the RAM pool."""

    model_config = _cel(
        (
            "!has(self.perNode) || !self.perNode || !has(self.replicas) || self.replicas <= 1",
            "spec.store.clients: perNode runs one per node; leave replicas at 1",
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


class MetricsPeerSpec(ApiModel):
    """Pods admitted to the store's metrics ports (a NetworkPolicy peer): those matching both selectors given."""

    model_config = _cel(
        (
            "has(self.namespaceSelector) || has(self.podSelector)",
            "spec.store.metricsFrom[]: a peer needs namespaceSelector or podSelector",
        ),
    )

    namespace_selector: LabelMap | None = None
    """Labels of the scraper's namespace (e.g. kubernetes.io/metadata.name: monitoring); unset: this namespace."""
    pod_selector: LabelMap | None = None
    """Labels of the scraper's pods; unset: every pod of the selected namespaces."""

    @model_validator(mode="after")
    def _selects_something(self) -> Self:
        if self.namespace_selector is None and self.pod_selector is None:
            raise _fail(
                "spec.store.metricsFrom[]",
                {},
                "a peer needs namespaceSelector or podSelector",
                "name the scraper's namespace or pods, e.g. namespaceSelector: {app: monitoring}",
            )
        return self


class StoreSpec(ApiModel):
    """The Mooncake store."""

    model_config = _cel(
        (
            "!has(self.mode) || self.mode != 'standalone' || !has(self.clients) "
            "|| (has(self.clients.perNode) && self.clients.perNode) "
            "|| !has(self.clients.replicas) || self.clients.replicas > 0",
            "spec.store.clients: standalone mode needs store clients; set clients.replicas > 0 or clients.perNode",
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
    metrics_from: list[MetricsPeerSpec] = Field(default=[], max_length=k.MAP_MAX)
    """Who may scrape the master's and the store clients' metrics ports besides the store's users (Prometheus).
    The master's metrics port also serves Mooncake's admin API, so admit only the scraper."""

    @model_validator(mode="after")
    def _standalone_has_clients(self) -> Self:
        if self.mode == "standalone" and not (self.clients.per_node or self.clients.replicas > 0):
            raise _fail(
                "spec.store.clients.replicas",
                self.clients.replicas,
                "standalone mode needs store clients",
                "set clients.replicas > 0 or clients.perNode",
            )
        return self


class SharedStorageSpec(ApiModel):
    """A volume every encoder and consumer mounts, for the shared-storage (example) connectors."""

    model_config = _cel(
        ("[has(self.pvc), has(self.hostPath)].filter(x, x).size() == 1", "spec.sharedStorage: give pvc or hostPath"),
    )

    pvc: PvcSource | None = None
    """A ReadWriteMany claim."""
    host_path: HostPathSource | None = None
    """A node directory (single node only)."""

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if (self.pvc is None) == (self.host_path is None):
            raise _fail("spec.sharedStorage", "pvc/hostPath", "needs exactly one volume", "give pvc or hostPath")
        return self


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
    """Instances of this role."""
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
    """Pods a rollout may add before it removes old ones. 0 (the default: GPUs are usually all allocated)
    replaces one pod at a time, so a role of one replica is down while its new pod loads; give spare GPUs and
    1 or more for a rollout that never lowers capacity."""


class EncoderSpec(_RoleCommon):
    """Encoder instances: run only the multimodal encoder and hand embeddings to prefill/PD."""

    tensor_parallel_size: int = Field(default=1, ge=1, le=k.TENSOR_PARALLEL_MAX)
    """Must be 1 with the Mooncake EC connector."""
    connector: Literal["mooncake", "shared-storage"] = "mooncake"
    """ECMooncakeConnector (transfer engine, needs no shared disk) or ECExampleConnector (sharedStorage)."""
    buffer_device: Literal["cuda", "cpu"] = "cuda"
    """Where the EC transfer buffer lives."""
    buffer_size: PositiveQuantity = 1_000_000_000
    """Bytes of the EC transfer buffer each encoder and each consumer registers (ECMooncakeConnector's
    ec_buffer_size; vLLM's default, 1e9, is kept unless set). It must hold the embeddings in flight at once."""
    cross_encoder_cache: CrossEncoderCacheSpec = CrossEncoderCacheSpec()
    """Reuse of encoder outputs across encoders."""


KVConnector = Literal["mooncake", "mooncake-store", "mooncake+store", "shared-storage"]


class PrefillKVSpec(ApiModel):
    """How KV moves from prefill to decode."""

    connector: KVConnector = "mooncake"
    """mooncake: P2P MooncakeConnector; mooncake-store: through the store (MooncakeStoreConnector);
    mooncake+store: both (MultiConnector, shared prefix cache); shared-storage: ExampleConnector."""
    load_async: bool = True
    """MooncakeStoreConnector: load KV asynchronously."""
    lookup_async: bool = False
    """MooncakeStoreConnector: look up the store asynchronously."""


_RESERVED = "[" + ", ".join(f"'{n}'" for n in k.RESERVED_POOL_NAMES) + "]"
_POOL_NAME_FIX = (
    f"one word of lowercase letters and digits starting with a letter, at most {k.POOL_NAME_MAX} characters, "
    f"not one of {', '.join(k.RESERVED_POOL_NAMES)} (e.g. tp2)"
)


class PrefillPoolSpec(ApiModel):
    """One more prefill pool, with its own TP size."""

    model_config = _cel(
        (f"!(self.name in {_RESERVED})", f"spec.prefill.additionalPools[].name: reserved. Fix: {_POOL_NAME_FIX}"),
    )

    name: str = Field(max_length=k.POOL_NAME_MAX, pattern=k.POOL_NAME)
    """Suffix of the pool's objects (<deployment>-prefill-<name>): one word of lowercase letters and digits
    starting with a letter, at most 15 characters, not a reserved word (master, store, encoder, prefill,
    decode, pd, proxy, bundle, main, client)."""
    replicas: int = Field(default=1, ge=0, le=k.REPLICAS_MAX)
    """Instances in this pool."""
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
    """What an instance does with a request whose KV load fails (vLLM's kv_load_failure_policy), e.g. a
    transient Mooncake P2P transfer error or a block gone from the store. "recompute" (default): the request is
    rescheduled and the failed blocks are computed locally; the output is the same, the request is slower, and
    vLLM logs the failure ("Recovered from KV load failure"), so a transient failure costs latency, not the
    request. "fail": the request ends with an error finish reason (vLLM's own default), for those who prefer
    an error to a hidden recompute cost. Applies to every instance that loads KV: decode, and prefill or PD
    instances that read prefix blocks from the store."""


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


class ProxySpec(ApiModel):
    """The E/P/D request proxy."""

    replicas: int = Field(default=1, ge=0, le=k.REPLICAS_MAX)
    """Proxy instances."""
    service: ProxyServiceSpec = ProxyServiceSpec()
    """Its Service."""
    routing: ProxyRoutingSpec = ProxyRoutingSpec()
    """Routing switches."""
    resources: Resources = Resources()
    """The proxy's resources (1 CPU and 1 GiB requested when empty)."""
    node_selector: LabelMap = {}
    """Nodes for the proxy (e.g. CPU nodes beside the GPU pool)."""


_SPEC_RULES = _cel(
    (
        "!self.encoder.crossEncoderCache.enabled || has(self.store)",
        "spec.encoder.crossEncoderCache: cross-encoder reuse needs a Mooncake store; add spec.store",
    ),
    (
        "!self.encoder.crossEncoderCache.enabled || !has(self.store) || !self.store.clients.offload.enabled",
        "spec.store.clients.offload.enabled: cross-encoder reuse needs a RAM-only store; disable offload",
    ),
    (
        "!self.encoder.crossEncoderCache.enabled || self.encoder.tensorParallelSize == 1",
        "spec.encoder.tensorParallelSize: cross-encoder reuse needs encoder TP 1",
    ),
    (
        "self.encoder.connector != 'mooncake' || self.encoder.tensorParallelSize == 1",
        "spec.encoder.tensorParallelSize: the Mooncake EC connector needs encoder TP 1; scale by replicas",
    ),
    (
        "!has(self.prefill) || has(self.prefill.kv)",
        "spec.prefill.kv: a prefill pool needs a KV connector; set spec.prefill.kv.connector",
    ),
    (
        "!has(self.prefill) || !has(self.prefill.kv) || !self.prefill.kv.connector.contains('store') "
        "|| has(self.store)",
        "spec.prefill.kv.connector: the store KV connectors need spec.store",
    ),
    (
        "(self.encoder.connector != 'shared-storage' && (!has(self.prefill) || !has(self.prefill.kv) "
        "|| self.prefill.kv.connector != 'shared-storage')) || has(self.sharedStorage)",
        "spec.sharedStorage: the shared-storage connectors need a shared volume; set spec.sharedStorage",
    ),
)


class EPDDeploymentSpec(ApiModel):
    """One encoder-disaggregated multimodal deployment: encoders, prefill and decode (or PD), proxy, store."""

    model_config = ConfigDict(**{**ApiModel.model_config, **_SPEC_RULES})

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

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Self:
        problems = spec_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self


def spec_problems(spec: EPDDeploymentSpec) -> list[str]:
    """The Python side of every CEL rule above, plus those CEL cannot express; one message each."""
    found: list[str] = []
    enc, store, prefill = spec.encoder, spec.store, spec.prefill
    if enc.cross_encoder_cache.enabled:
        if store is None:
            found.append(
                str(_fail("spec.encoder.crossEncoderCache.enabled", True, "needs a Mooncake store", "add spec.store"))
            )
        elif store.clients.offload.enabled:
            found.append(
                str(
                    _fail(
                        "spec.store.clients.offload.enabled",
                        True,
                        "cross-encoder reuse needs a RAM-only store",
                        "disable offload",
                    )
                )
            )
        if spec.model.mm_processor_cache_gb <= 0:
            found.append(
                str(
                    _fail(
                        "spec.model.mmProcessorCacheGB",
                        spec.model.mm_processor_cache_gb,
                        "cross-encoder reuse needs the processor cache",
                        "set it above 0",
                    )
                )
            )
        if enc.connector != "mooncake":
            found.append(
                str(
                    _fail(
                        "spec.encoder.connector",
                        enc.connector,
                        "cross-encoder reuse needs the Mooncake EC connector",
                        "use connector: mooncake",
                    )
                )
            )
    if enc.connector == "mooncake" and enc.tensor_parallel_size != 1:
        found.append(
            str(
                _fail(
                    "spec.encoder.tensorParallelSize",
                    enc.tensor_parallel_size,
                    "the Mooncake EC connector needs encoder TP 1",
                    "scale encoders by replicas",
                )
            )
        )
    if prefill is not None:
        if prefill.kv is None:
            found.append(
                str(
                    _fail(
                        "spec.prefill.kv", None, "a prefill pool needs a KV connector", "set spec.prefill.kv.connector"
                    )
                )
            )
        elif "store" in prefill.kv.connector and store is None:
            found.append(
                str(
                    _fail("spec.prefill.kv.connector", prefill.kv.connector, "needs a Mooncake store", "add spec.store")
                )
            )
        if spec.decode.kv.store_offload:
            found.append(
                str(
                    _fail(
                        "spec.decode.kv.storeOffload",
                        True,
                        "applies to combined PD only",
                        "remove it, or remove spec.prefill",
                    )
                )
            )
    if spec.decode.kv.store_offload and store is None:
        found.append(str(_fail("spec.decode.kv.storeOffload", True, "needs a Mooncake store", "add spec.store")))
    uses_shared = enc.connector == "shared-storage" or (
        prefill is not None and prefill.kv is not None and prefill.kv.connector == "shared-storage"
    )
    if uses_shared and spec.shared_storage is None:
        found.append(
            str(
                _fail(
                    "spec.sharedStorage",
                    None,
                    "the shared-storage connectors need a shared volume",
                    "set spec.sharedStorage",
                )
            )
        )
    return found
