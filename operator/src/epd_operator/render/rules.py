"""Rules only the whole spec can decide, checked before any bundle is built, each naming the spec field.

The API models check each field and the cross-field rules CEL can express; these need the derived names, the
prefill pools together, the ports of a pod, or what the operator renders into vLLM's argv.
"""

from __future__ import annotations

from collections.abc import Callable

from epd_connectors.config.kv_transfer import p2p_tp_fits
from epd_connectors.config.roles import VLLM_ROLES, Role
from epd_connectors.config.vllm import OWNED_FLAGS, owned_flag
from epd_operator.api.spec import EPDDeploymentSpec
from epd_operator.api.store import StoreSpec
from epd_operator.derive import names as naming
from epd_operator.derive import ports
from epd_operator.render import bundles_vllm
from epd_operator.render.context import Context, Unit


def whole_spec_problems(ctx: Context, units: list[Unit]) -> list[str]:
    """Every problem only the whole spec shows, one line each; empty when render may proceed."""
    found = naming.name_problems(
        ctx.names,
        [u.name for u in units],
        [u.name for u in units if u.role == Role.STORE_CLIENT and u.replicas is not None],
    )
    found += _pool_problems(ctx)
    found += _version_problems(ctx)
    found += _p2p_tp_problems(ctx, units)
    if ctx.spec.store is not None:
        found += _store_problems(ctx.spec.store)
    for unit in units:
        if unit.role in VLLM_ROLES:
            found += _vllm_problems(ctx, unit)
        found += _autoscaling_problems(ctx, unit)
    return list(dict.fromkeys(found))  # prefill pools share the main pool's extraArgs: report once


NEWER_KEYS: tuple[tuple[str, str, Callable[[EPDDeploymentSpec], object]], ...] = (
    (
        "spec.prefill.kv.leaseDurationSeconds",
        "0.34",
        lambda s: s.prefill_kv.lease_duration_seconds if s.prefill_kv else None,
    ),
    ("spec.store.kvLookupTimeoutSeconds", "0.34", lambda s: s.store.kv_lookup_timeout_seconds if s.store else None),
)
"""Fields that set a connector key only a newer vLLM reads: (field, the first vLLM that reads it, its value)."""


def _version_problems(ctx: Context) -> list[str]:
    """A key an older vLLM would ignore: refused, since the user asked for its effect and would not get it."""
    return [
        f"{field} = {value!r}: vLLM {ctx.vllm_version} does not read it (it is new in vLLM {since}). Fix: remove it, "
        f"or run vLLM {since} (spec.images.vllmVersion: '{since}' with its image)"
        for field, since, read in NEWER_KEYS
        if (value := read(ctx.spec)) is not None and _older(ctx.vllm_version, since)
    ]


def _older(version: str, than: str) -> bool:
    return tuple(int(p) for p in version.split(".")) < tuple(int(p) for p in than.split("."))


def _autoscaling_problems(ctx: Context, unit: Unit) -> list[str]:
    """KEDA's triggers query a Prometheus only the operator's settings name."""
    if unit.autoscaling is None or unit.autoscaling.engine != "keda" or ctx.defaults.prometheus_url is not None:
        return []
    return [
        f"{unit.spec_path}.autoscaling.engine = 'keda': the operator knows no Prometheus for KEDA to query. Fix: "
        "install the operator chart with autoscaling.prometheusUrl set (the operator's --prometheus-url), or use "
        "engine: hpa with the cluster's metrics adapter"
    ]


def _pool_problems(ctx: Context) -> list[str]:
    if ctx.spec.prefill is None:
        return []
    found: list[str] = []
    seen = {naming.MAIN_POOL}
    for i, pool in enumerate(ctx.spec.prefill.additional_pools):
        if pool.name in seen:
            found.append(
                f"spec.prefill.additionalPools[{i}].name = {pool.name!r}: already used (the main pool is "
                f"{naming.MAIN_POOL!r}). Fix: give every pool its own name"
            )
        seen.add(pool.name)
    return found


def _p2p_tp_problems(ctx: Context, units: list[Unit]) -> list[str]:
    """MooncakeConnector: the proxy pairs any prefill pool with the decode, and vLLM hands KV over only between
    TP sizes of which one divides the other (the connector library's p2p_tp_fits)."""
    if ctx.spec.prefill is None or not ctx.spec.p2p_kv:
        return []
    decode_tp = ctx.spec.decode.tensor_parallel_size
    connector = ctx.spec.prefill.kv.connector if ctx.spec.prefill.kv else None
    return [
        f"{u.spec_path}.tensorParallelSize = {u.tensor_parallel_size} with spec.decode.tensorParallelSize = "
        f"{decode_tp}: spec.prefill.kv.connector {connector} hands KV over P2P (MooncakeConnector) only between "
        "TP sizes of which one divides the other; vLLM would fail the first transfer. Fix: give this pool a TP "
        f"that divides or is a multiple of {decode_tp}, or a decode TP that does so for every prefill pool"
        for u in units
        if u.role == Role.PREFILL and not p2p_tp_fits(u.tensor_parallel_size, decode_tp)
    ]


def _store_problems(store: StoreSpec) -> list[str]:
    found = ports.collisions(ports.master_ports(store.master), "spec.store.master ports")
    if store.mode == "standalone":
        found += ports.collisions(ports.store_client_ports(store.clients), "spec.store.clients.port")
    elif store.clients.offload.enabled:
        found.append(
            "spec.store.clients.offload.enabled = True: embedded mode has no store clients to hold an SSD tier. "
            "Fix: use mode standalone, or disable offload"
        )
    if store.tenant.quota is not None and not store.tenant.isolation:
        found.append(
            f"spec.store.tenant.quota = {store.tenant.quota}: a quota is enforced only with isolation. "
            "Fix: set spec.store.tenant.isolation true, or remove the quota"
        )
    return found


# Every flag the operator renders (the connector library's OWNED_FLAGS plus --mm-processor-kwargs), with
# where the user sets what it controls instead; {path} is the role's spec section.
_BY_FIELD = {
    "model": "the weights come from spec.model.source and spec.model.path",
    "served_model_name": "set spec.model.servedModelName",
    "host": "the operator wires the listener into Services and probes",
    "port": "the operator wires the listener into Services and probes",
    "dtype": "set spec.model.dtype",
    "tensor_parallel_size": "set {path}.tensorParallelSize",
    "pipeline_parallel_size": "each pod is one pipeline and data-parallel rank; scale with replicas",
    "data_parallel_size": "each pod is one pipeline and data-parallel rank; scale with replicas",
    "block_size": "set spec.model.blockSize",
    "max_num_batched_tokens": "set {path}.maxNumBatchedTokens",
    "mm_processor_cache_gb": "set spec.model.mmProcessorCacheGB",
    "mm_encoder_only": "encoders always run encoder-only, other roles never",
    "enable_lora": "LoRA is not supported by the disaggregated connectors",
    "enforce_eager": "set {path}.enforceEager",
    "enable_prefix_caching": "the operator decides prefix caching per role",
    "enable_mm_embeds": "the operator enables it wherever the proxy sends embeddings",
    "prefix_caching_hash_algo": "the operator decides the block hash (one PYTHONHASHSEED per deployment)",
    "shutdown_timeout_s": "the operator drains a deleted vLLM pod (a preStop delay, then vLLM's --shutdown-timeout) "
    "within the pod's grace period",
    "ec_transfer_config": "choose spec.encoder.connector",
    "kv_transfer_config": "choose spec.prefill.kv.connector or spec.decode.kv",
    "media.domains": "set spec.media.allowedDomains (the proxy checks media URLs against it too)",
    "media.local_path": "set spec.media.allowedLocalMediaPath (the proxy checks file URLs against it too)",
    "extra_args": "list the arguments in extraArgs themselves",
}
_OWNED_BY = {flag: _BY_FIELD[field] for flag, field in OWNED_FLAGS.items()}
_OWNED_BY[bundles_vllm.MM_PROCESSOR_KWARGS_FLAG] = (
    "set spec.model.mmProcessorKwargs (part of the embedding cache identity)"
)


def _vllm_problems(ctx: Context, unit: Unit) -> list[str]:
    """Rules whose connector-library message would not name the spec field to change."""
    found: list[str] = []
    section = bundles_vllm.role_spec(ctx, unit)
    base_path = "spec.prefill" if unit.role == Role.PREFILL else unit.spec_path
    for arg in section.extra_args:
        flag = owned_flag(arg, _OWNED_BY)
        if flag is not None:
            found.append(
                f"{base_path}.extraArgs = {arg!r}: sets {flag}, which the operator renders. "
                f"Fix: remove it; {_OWNED_BY[flag].format(path=base_path)}"
            )
    if unit.role == Role.DECODE and ctx.store_tp and ctx.store_tp % unit.tensor_parallel_size:
        found.append(
            f"spec.decode.tensorParallelSize = {unit.tensor_parallel_size}: the store TP (LCM of the prefill TP "
            f"sizes {list(ctx.prefill_tp_sizes)}) is {ctx.store_tp}, not a multiple of it, so decode could not "
            "read the prefill's blocks. Fix: use a decode TP that divides the store TP, or add a prefill pool "
            "with the decode's TP"
        )
    if unit.role in (Role.DECODE, Role.PD) and ctx.spec.decode.kv.save_decode_cache and not ctx.spec.store_kv_split:
        found.append(
            "spec.decode.kv.saveDecodeCache = True: only a decoder reading KV from the store saves its blocks. "
            "Fix: remove it, or use spec.prefill.kv.connector mooncake-store or mooncake+store"
        )
    return found
