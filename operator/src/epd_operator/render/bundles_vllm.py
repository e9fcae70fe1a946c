"""The bundles of the vLLM roles: encoder, prefill (per pool), decode and combined PD.

Each bundle holds only what that role's process needs and nothing that changes when another role scales, so
its hash rolls exactly that role. The vLLM flags come from one spec field each; see `server_config`.
"""

from __future__ import annotations

import json
from typing import Literal

from epd_connectors.config.bundle import Peers, Role, RoleBundle
from epd_connectors.config.master import MasterConfig
from epd_connectors.config.mooncake import MooncakeStoreConfig
from epd_connectors.config.vllm import OWNED_FLAGS, VllmServerConfig
from epd_operator.api import constants as c
from epd_operator.api.spec import DecodeSpec, EncoderSpec, PrefillSpec
from epd_operator.derive import ports
from epd_operator.render import transfer
from epd_operator.render.bundles_store import master_peers
from epd_operator.render.context import Context, Unit

MM_PROCESSOR_KWARGS_FLAG = "--mm-processor-kwargs"
"""Rendered from spec.model.mmProcessorKwargs, which is part of the embedding cache identity; so a user may not
pass it in extraArgs as well."""

VllmRoleName = Literal["encoder", "prefill", "decode", "pd"]
_VLLM_ROLES: dict[str, VllmRoleName] = {
    c.ROLE_ENCODER: "encoder",
    c.ROLE_PREFILL: "prefill",
    c.ROLE_DECODE: "decode",
    c.ROLE_PD: "pd",
}


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
    "prefix_caching_hash_algo": "the operator decides the block hash (one PYTHONHASHSEED per deployment)",
    "ec_transfer_config": "choose spec.encoder.connector",
    "kv_transfer_config": "choose spec.prefill.kv.connector or spec.decode.kv",
    "extra_args": "list the arguments in extraArgs themselves",
}
_OWNED_BY = {flag: _BY_FIELD[field] for flag, field in OWNED_FLAGS.items()}
_OWNED_BY[MM_PROCESSOR_KWARGS_FLAG] = "set spec.model.mmProcessorKwargs (part of the embedding cache identity)"


def owned_flag(arg: str) -> str | None:
    """The rendered flag an extra argument would set, read as vLLM's argparse reads it: '_' as '-', the
    '--flag=value' and '--json-flag.key' forms, and unambiguous prefixes (allow_abbrev)."""
    if not arg.startswith("-") or arg in ("-", "--"):
        return None
    if not arg.startswith("--"):  # short forms (-tp) are matched exactly, as argparse does
        short = arg.split("=", 1)[0]
        return short if short in _OWNED_BY else None
    name = "--" + arg[2:].split("=", 1)[0].split(".", 1)[0].replace("_", "-")
    if name in _OWNED_BY:
        return name
    matches = [flag for flag in _OWNED_BY if flag.startswith(name)]
    return matches[0] if len(name) > 2 and matches else None


def model_path(ctx: Context) -> str:
    """Where vLLM loads the weights: the model volume, plus spec.model.path inside it."""
    sub = ctx.spec.model.path.strip("/")
    return f"{c.MODEL_MOUNT_DIR}/{sub}" if sub else c.MODEL_MOUNT_DIR


def role_spec(ctx: Context, unit: Unit) -> EncoderSpec | PrefillSpec | DecodeSpec:
    """The spec section a unit's extraArgs, env, resources and nodeSelector come from (pools use prefill's)."""
    if unit.role == c.ROLE_ENCODER:
        return ctx.spec.encoder
    if unit.role == c.ROLE_PREFILL and ctx.spec.prefill is not None:
        return ctx.spec.prefill
    return ctx.spec.decode


def precheck(ctx: Context, unit: Unit) -> list[str]:
    """Rules whose connector-library message would not name the spec field to change."""
    found: list[str] = []
    section = role_spec(ctx, unit)
    base_path = "spec.prefill" if unit.role == c.ROLE_PREFILL else unit.spec_path
    for arg in section.extra_args:
        flag = owned_flag(arg)
        if flag is not None:
            found.append(
                f"{base_path}.extraArgs = {arg!r}: sets {flag}, which the operator renders. "
                f"Fix: remove it; {_OWNED_BY[flag].format(path=base_path)}"
            )
    if unit.role == c.ROLE_DECODE and ctx.store_tp and ctx.store_tp % unit.tensor_parallel_size:
        found.append(
            f"spec.decode.tensorParallelSize = {unit.tensor_parallel_size}: the store TP (LCM of the prefill TP "
            f"sizes {list(ctx.prefill_tp_sizes)}) is {ctx.store_tp}, not a multiple of it, so decode could not "
            "read the prefill's blocks. Fix: use a decode TP that divides the store TP, or add a prefill pool "
            "with the decode's TP"
        )
    if unit.role in (c.ROLE_DECODE, c.ROLE_PD) and ctx.spec.decode.kv.save_decode_cache and not ctx.store_kv_split:
        found.append(
            "spec.decode.kv.saveDecodeCache = True: only a decoder reading KV from the store saves its blocks. "
            "Fix: remove it, or use spec.prefill.kv.connector mooncake-store or mooncake+store"
        )
    return found


def server_config(ctx: Context, unit: Unit) -> VllmServerConfig:
    """One vLLM server: model and identity from spec.model, parallelism from the unit, the seed derived."""
    model = ctx.spec.model
    section = role_spec(ctx, unit)
    role = _VLLM_ROLES[unit.role]
    extra: list[str] = []
    if model.mm_processor_kwargs:
        kwargs = json.dumps(dict(sorted(model.mm_processor_kwargs.items())), separators=(",", ":"))
        extra += [MM_PROCESSOR_KWARGS_FLAG, kwargs]
    cross_encoder = unit.role == c.ROLE_ENCODER and ctx.spec.encoder.cross_encoder_cache.enabled
    return VllmServerConfig(
        role=role,
        model=model_path(ctx),
        served_model_name=model.served_model_name or model.name,
        port=ports.VLLM_HTTP_PORT,
        dtype=model.dtype,
        tensor_parallel_size=unit.tensor_parallel_size,
        block_size=model.block_size if unit.role != c.ROLE_ENCODER else None,
        max_num_batched_tokens=section.max_num_batched_tokens,
        enforce_eager=section.enforce_eager,
        mm_processor_cache_gb=model.mm_processor_cache_gb,
        # Cross-encoder reuse needs Model Runner V2 (facts.md); elsewhere vLLM chooses.
        use_v2_model_runner=True if cross_encoder else None,
        python_hash_seed=ctx.hash_seed,
        mooncake_bootstrap_port=(
            ports.KV_BOOTSTRAP_PORT
            if unit.role in (c.ROLE_PREFILL, c.ROLE_DECODE) and transfer.uses_p2p_kv(ctx)
            else None
        ),
        extra_args=(*extra, *section.extra_args),
    )


def vllm_bundle(
    ctx: Context, unit: Unit, master: MasterConfig | None, store_json: MooncakeStoreConfig | None
) -> RoleBundle:
    """The role's bundle; the Mooncake JSON and the master waits only where a connector uses the store."""
    server = server_config(ctx, unit)
    ec = None
    if unit.role == c.ROLE_ENCODER:
        ec = transfer.encoder_ec(ctx)
    elif unit.role in (c.ROLE_PREFILL, c.ROLE_PD):
        ec = transfer.consumer_ec(ctx)
    kv = transfer.kv_config(ctx, unit.role)
    uses_store = transfer.uses_store(ec, kv) and master is not None and store_json is not None
    return RoleBundle(
        deployment=ctx.owner.name,
        namespace=ctx.owner.namespace,
        role=Role(unit.role),
        env=dict(role_spec(ctx, unit).env),
        vllm=server,
        ec_transfer=ec,
        kv_transfer=kv,
        mooncake=store_json if uses_store else None,
        peers=master_peers(ctx, master) if uses_store and master is not None else Peers(),
    )
