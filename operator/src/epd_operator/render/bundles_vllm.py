"""The bundles of the vLLM roles: encoder, prefill (per pool), decode and combined PD.

Each bundle holds only what that role's process needs and nothing that changes when another role scales, so
its hash rolls exactly that role. The vLLM flags come from one spec field each; see `server_config`.
"""

from __future__ import annotations

import json

from epd_connectors.config.bundle import Peers, RoleBundle, needs_store
from epd_connectors.config.master import MasterConfig
from epd_connectors.config.mooncake import MooncakeStoreConfig
from epd_connectors.config.roles import VLLM_ROLES, Role
from epd_connectors.config.vllm import V2_ONLY_VERSIONS, VllmServerConfig
from epd_operator.api import constants as c
from epd_operator.api.spec import DecodeSpec, EncoderSpec, PrefillSpec
from epd_operator.render import transfer
from epd_operator.render.bundles_store import master_peers
from epd_operator.render.context import Context, Unit

MM_PROCESSOR_KWARGS_FLAG = "--mm-processor-kwargs"
"""Rendered from spec.model.mmProcessorKwargs, which is part of the embedding cache identity; so a user may not
pass it in extraArgs as well (render.rules refuses it)."""


def model_path(ctx: Context) -> str:
    """Where vLLM loads the weights: the model volume, plus spec.model.path inside it."""
    sub = ctx.spec.model.path.strip("/")
    root = ctx.site.paths.model_dir
    return f"{root}/{sub}" if sub else root


def role_spec(ctx: Context, unit: Unit) -> EncoderSpec | PrefillSpec | DecodeSpec:
    """The spec section a unit's extraArgs, env, resources and nodeSelector come from (pools use prefill's)."""
    if unit.role == Role.ENCODER:
        return ctx.spec.encoder
    if unit.role == Role.PREFILL and ctx.spec.prefill is not None:
        return ctx.spec.prefill
    return ctx.spec.decode


def server_config(ctx: Context, unit: Unit) -> VllmServerConfig:
    """One vLLM server: model and identity from spec.model, parallelism from the unit, the seed derived."""
    model = ctx.spec.model
    section = role_spec(ctx, unit)
    assert unit.role in VLLM_ROLES, unit.role
    role = unit.role
    extra: list[str] = []
    if model.mm_processor_kwargs:
        kwargs = json.dumps(dict(sorted(model.mm_processor_kwargs.items())), separators=(",", ":"))
        extra += [MM_PROCESSOR_KWARGS_FLAG, kwargs]
    cross_encoder = unit.role == Role.ENCODER and ctx.spec.encoder.cross_encoder_cache.enabled
    return VllmServerConfig(
        role=role,
        model=model_path(ctx),
        served_model_name=model.served_model_name or model.name,
        port=ctx.vllm_http_port(unit),
        **ctx.bind_host,
        dtype=model.dtype,
        tensor_parallel_size=unit.tensor_parallel_size,
        block_size=model.block_size if unit.role != Role.ENCODER else None,
        max_num_batched_tokens=section.max_num_batched_tokens,
        enforce_eager=section.enforce_eager,
        mm_processor_cache_gb=model.mm_processor_cache_gb,
        vllm_version=ctx.vllm_version,
        # Cross-encoder reuse needs Model Runner V2 (facts.md); elsewhere vLLM chooses. 0.34 has no other.
        use_v2_model_runner=True if cross_encoder and ctx.vllm_version not in V2_ONLY_VERSIONS else None,
        python_hash_seed=ctx.hash_seed,
        mooncake_bootstrap_port=(ctx.bootstrap_port(unit) if transfer.runs_bootstrap_server(ctx, unit.role) else None),
        shutdown_timeout_s=c.VLLM_SHUTDOWN_TIMEOUT_S,
        media=ctx.spec.media.access,
        extra_args=(*extra, *section.extra_args),
    )


def vllm_bundle(
    ctx: Context, unit: Unit, master: MasterConfig | None, store_json: MooncakeStoreConfig | None
) -> RoleBundle:
    """The role's bundle; the Mooncake JSON and the master waits only where a connector uses the store."""
    server = server_config(ctx, unit)
    ec = None
    if unit.role == Role.ENCODER:
        ec = transfer.encoder_ec(ctx)
    elif unit.role in (Role.PREFILL, Role.PD):
        ec = transfer.consumer_ec(ctx, unit)
    kv = transfer.kv_config(ctx, unit.role)
    uses_store = needs_store(ec, kv) and master is not None and store_json is not None
    return RoleBundle(
        deployment=ctx.owner.name,
        namespace=ctx.owner.namespace,
        role=unit.role,
        env=dict(role_spec(ctx, unit).env),
        vllm=server,
        ec_transfer=ec,
        kv_transfer=kv,
        mooncake=store_json if uses_store else None,
        peers=master_peers(ctx, master) if uses_store and master is not None else Peers(),
    )
