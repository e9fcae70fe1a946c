"""The EC and KV transfer configs of each vLLM role, chosen from spec.encoder.connector and
spec.prefill.kv.connector (or spec.decode.kv.storeOffload for combined PD).

Producer and consumer configs come from the same few values (protocol, buffer device, shared path, cache prefix,
store TP list), so a pair can only agree. Layouts follow facts.md: XpYd is a MultiConnector of MooncakeConnector
(P2P first: a direct transfer beats the store) and MooncakeStoreConnector.

Every KV config carries spec.decode.kv.loadFailurePolicy as kv_load_failure_policy. vLLM reads it only from
the top-level config (the scheduler, vllm/v1/core/sched/scheduler.py), never from a MultiConnector child; the
children carry the same value so the JSON cannot read as a different policy. Decode loads from the prefill or
the store; a prefill or PD with MooncakeStoreConnector (kv_both) loads prefix hits from the store and reports
failed loads the same way; pure producers never load, where the value is inert.
"""

from __future__ import annotations

from typing import Literal

from epd_connectors.config.ec_transfer import (
    ECConfig,
    ECExampleConnectorConfig,
    ECExampleExtra,
    ECMooncakeConsumer,
    ECMooncakeConsumerExtra,
    ECMooncakeProducer,
    ECMooncakeProducerExtra,
)
from epd_connectors.config.kv_transfer import (
    AnyKVConfig,
    ExampleKVConnectorConfig,
    ExampleKVExtra,
    MooncakeConnectorConfig,
    MooncakeP2PExtra,
    MooncakeStoreConnectorConfig,
    MooncakeStoreExtra,
    MultiConnectorConfig,
    MultiExtra,
)
from epd_connectors.config.roles import Role
from epd_operator.derive import identity
from epd_operator.render.context import EC_SUBDIR, KV_SUBDIR, Context, Unit

Protocol = Literal["rdma", "tcp"]
FailurePolicy = Literal["recompute", "fail"]


def _protocol(ctx: Context) -> Protocol:
    return "tcp" if ctx.protocol == "tcp" else "rdma"


def encoder_ec(ctx: Context) -> ECConfig:
    """The encoders' producer config; cross-encoder reuse adds the shared prefix and model identity."""
    enc = ctx.spec.encoder
    if enc.uses_shared_storage:
        return ECExampleConnectorConfig(
            ec_role="ec_producer",
            ec_connector_extra_config=ECExampleExtra(shared_storage_path=ctx.shared_path(EC_SUBDIR)),
        )
    reuse = enc.cross_encoder_cache
    extra = ECMooncakeProducerExtra(mooncake_protocol=_protocol(ctx))
    if reuse.enabled:
        extra = ECMooncakeProducerExtra(
            mooncake_protocol=_protocol(ctx),
            cross_encoder_cache=True,
            embedding_cache_prefix=ctx.embedding_prefix,
            embedding_model_identity=identity.embedding_model_identity(ctx.spec.model),
            store_max_pending_items=reuse.max_pending_items,
            store_max_pending_bytes=reuse.max_pending_bytes,
            store_read_buffer_bytes=reuse.read_buffer_bytes,
        )
    return ECMooncakeProducer(
        ec_buffer_device=enc.buffer_device, ec_buffer_size=enc.buffer_size, ec_connector_extra_config=extra
    )


def consumer_ec(ctx: Context, unit: Unit) -> ECConfig:
    """A prefill or PD instance's consumer config; ec_ip is the site's own address (in a cluster, the pod IP
    at launch)."""
    enc = ctx.spec.encoder
    if enc.uses_shared_storage:
        return ECExampleConnectorConfig(
            ec_role="ec_consumer",
            ec_connector_extra_config=ECExampleExtra(shared_storage_path=ctx.shared_path(EC_SUBDIR)),
        )
    return ECMooncakeConsumer(
        # Encoders and consumers run on the same kind of hardware; one setting keeps their pools alike.
        ec_buffer_device=enc.buffer_device,
        ec_buffer_size=enc.buffer_size,
        ec_ip=ctx.own_address,
        ec_port=ctx.ec_port(unit),
        ec_connector_extra_config=ECMooncakeConsumerExtra(mooncake_protocol=_protocol(ctx)),
    )


def _load_failure_policy(ctx: Context) -> FailurePolicy:
    return ctx.spec.decode.kv.load_failure_policy


def _store_child(ctx: Context, kv_role: Literal["kv_both", "kv_consumer"]) -> MooncakeStoreConnectorConfig:
    kv = ctx.spec.prefill_kv
    split = ctx.spec.prefill is not None
    extra = MooncakeStoreExtra(
        cache_prefix=ctx.kv_prefix,
        load_async=kv.load_async if kv else True,
        lookup_async=kv.lookup_async if kv else False,
        save_decode_cache=kv_role == "kv_consumer" and ctx.spec.decode.kv.save_decode_cache,
        # On a split every prefiller and decoder carries the same list, so mixed prefill TPs share blocks.
        enable_store_tp_lcm=split,
        prefill_tp_sizes=ctx.prefill_tp_sizes if split else None,
        lookup_timeout_s=ctx.spec.store.kv_lookup_timeout_seconds if ctx.spec.store else None,
    )
    return MooncakeStoreConnectorConfig(
        kv_role=kv_role, kv_connector_extra_config=extra, kv_load_failure_policy=_load_failure_policy(ctx)
    )


def _p2p_child(ctx: Context, kv_role: Literal["kv_producer", "kv_consumer"]) -> MooncakeConnectorConfig:
    kv = ctx.spec.prefill_kv
    extra = MooncakeP2PExtra(
        mooncake_protocol=_protocol(ctx),
        device_name=ctx.device_name,
        kv_lease_duration=kv.lease_duration_seconds if kv else None,  # one value on prefill and decode
    )
    return MooncakeConnectorConfig(
        kv_role=kv_role, kv_connector_extra_config=extra, kv_load_failure_policy=_load_failure_policy(ctx)
    )


def kv_config(ctx: Context, role: str) -> AnyKVConfig | None:
    """The role's KV connector: prefill produces, decode consumes, PD offloads (or has none)."""
    kv = ctx.spec.prefill_kv
    if role == Role.PD:
        return _store_child(ctx, "kv_both") if ctx.spec.decode.kv.store_offload else None
    if role == Role.ENCODER or kv is None:
        return None
    producer = role == Role.PREFILL
    if kv.uses_shared_storage:
        return ExampleKVConnectorConfig(
            kv_role="kv_producer" if producer else "kv_consumer",
            kv_connector_extra_config=ExampleKVExtra(shared_storage_path=ctx.shared_path(KV_SUBDIR)),
            kv_load_failure_policy=_load_failure_policy(ctx),
        )
    p2p = _p2p_child(ctx, "kv_producer" if producer else "kv_consumer") if kv.uses_p2p else None
    store = _store_child(ctx, "kv_both" if producer else "kv_consumer") if kv.uses_store else None
    if p2p is None or store is None:
        return p2p or store
    return MultiConnectorConfig(
        kv_role="kv_producer" if producer else "kv_consumer",
        kv_connector_extra_config=MultiExtra(connectors=(p2p, store)),
        kv_load_failure_policy=_load_failure_policy(ctx),
    )


def runs_bootstrap_server(ctx: Context, role: str) -> bool:
    """Whether the role's pods run MooncakeConnector's bootstrap server, and so get its port: prefill only. vLLM
    (0.32 and 0.33 MooncakeConnectorWorker) starts it and registers with it only when not a kv_consumer; a
    decoder reaches the prefill's server at the address the proxy puts in kv_transfer_params."""
    return role == Role.PREFILL and ctx.spec.p2p_kv


def uses_shared_storage(ctx: Context, role: str) -> bool:
    """Whether the role's pods mount spec.sharedStorage (an EC or KV shared-storage connector touches it)."""
    kv = ctx.spec.prefill_kv
    enc_shared = ctx.spec.encoder.uses_shared_storage and role in (Role.ENCODER, Role.PREFILL, Role.PD)
    kv_shared = kv is not None and kv.uses_shared_storage and role in (Role.PREFILL, Role.DECODE)
    return enc_shared or kv_shared
