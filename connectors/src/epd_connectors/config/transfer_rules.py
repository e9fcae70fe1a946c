"""The rules that join a vLLM server's settings with its EC and KV transfer configs.

They sit above the models they read (vllm, ec_transfer, kv_transfer), so no model imports another to check it:
the bundle runs `check_transfers` when it is validated, and `VllmServerConfig.argv` only renders.
"""

from __future__ import annotations

from epd_connectors.config.base import MAX_PORT, problem
from epd_connectors.config.ec_transfer import ECConfig, ECMooncakeConsumer, ECMooncakeProducer
from epd_connectors.config.kv_transfer import (
    DEFAULT_BOOTSTRAP_PORT,
    AnyKVConfig,
    MooncakeConnectorConfig,
    MooncakeStoreConnectorConfig,
    MooncakeStoreExtra,
    connectors_of,
)
from epd_connectors.config.roles import Role
from epd_connectors.config.vllm import V2_ONLY_VERSIONS, VllmServerConfig

HASH_SEED_ALGOS = frozenset({"xxhash", "xxhash_cbor"})
"""Prefix-caching hash algorithms that seed per process: store sharers then need one PYTHONHASHSEED."""


def check_transfers(
    server: VllmServerConfig, ec: ECConfig | None, kv: AnyKVConfig | None, *, store_offload: bool | None = False
) -> list[str]:
    """Every rule between a server and its EC/KV configs, one line per problem (empty when fine).

    ``store_offload``: the Mooncake JSON's enable_offload, None when the pod has no Mooncake store config.
    """
    found: list[str] = []
    if ec is None and server.role == Role.ENCODER:
        found.append(problem("ec_transfer_config", None, "an encoder needs an EC connector", "give one"))
    elif ec is not None and server.role == Role.DECODE:
        found.append(
            problem(
                "ec_transfer_config",
                ec.ec_connector,
                "decode gets KV from prefill, not embeddings",
                "drop it",
            )
        )
    elif ec is not None and server.role == Role.ENCODER:
        found.extend(check_encoder(ec, server, store_offload=store_offload))
    elif ec is not None:
        found.extend(check_consumer(ec, server))
    found.extend(check_kv(kv, server))
    return found


def check_encoder(
    ec: ECConfig,
    server: VllmServerConfig,
    *,
    store_offload: bool | None = False,
) -> list[str]:
    """Rules spanning an encoder's EC config and its vLLM server settings; one line per problem.

    ``store_offload`` is the vLLM-side Mooncake JSON's ``enable_offload``, or None when the encoder has no
    Mooncake store config (MOONCAKE_CONFIG_PATH) at all.
    """
    found: list[str] = []
    if server.role != Role.ENCODER:
        found.append(problem("vllm.role", server.role, "is not an encoder", "use check_consumer for it"))
    if ec.ec_role not in ("ec_producer", "ec_both") or isinstance(ec, ECMooncakeConsumer):
        found.append(problem("ec_transfer_config.ec_role", ec.ec_role, "an encoder must produce", "use ec_producer"))
    if not isinstance(ec, ECMooncakeProducer):
        return found
    # vLLM 0.33: MooncakeECConfig.from_vllm_config refuses every parallel layout on a producer.
    for field in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        size = getattr(server, field)
        if size != 1:
            found.append(
                problem(
                    f"vllm.{field}",
                    size,
                    "ECMooncakeConnector producers need 1",
                    "scale encoders by replicas",
                )
            )
    if ec.ec_connector_extra_config.cross_encoder_cache:
        found.extend(_cross_encoder_problems(server, store_offload))
    return found


def _cross_encoder_problems(server: VllmServerConfig, store_offload: bool | None) -> list[str]:
    """What cross_encoder_cache needs of the server and the store (vLLM 0.33 and the seed document)."""
    why = "cross_encoder_cache requires"
    found: list[str] = []
    if server.use_v2_model_runner is not True and server.vllm_version not in V2_ONLY_VERSIONS:
        found.append(
            problem(
                "vllm.use_v2_model_runner",
                server.use_v2_model_runner,
                f"{why} Model Runner V2 (left unset vLLM may fall back to V1)",
                "set it to true (VLLM_USE_V2_MODEL_RUNNER=1)",
            )
        )
    if server.enable_lora:
        found.append(problem("vllm.enable_lora", True, f"{why} no LoRA", "disable LoRA on encoders"))
    if server.mm_processor_cache_gb <= 0:
        found.append(
            problem(
                "vllm.mm_processor_cache_gb",
                server.mm_processor_cache_gb,
                f"{why} a multimodal processor cache to keep content identifiers",
                "set it above 0 (vLLM default 4)",
            )
        )
    if store_offload is None:
        found.append(
            problem(
                "mooncake store",
                None,
                f"{why} a Mooncake store (MOONCAKE_CONFIG_PATH) on every encoder",
                "configure the store for the encoders",
            )
        )
    elif store_offload:
        found.append(
            problem(
                "mooncake.enable_offload",
                True,
                f"{why} a RAM-only store",
                "set enable_offload false in the encoders' Mooncake JSON",
            )
        )
    return found


def check_consumer(ec: ECConfig, server: VllmServerConfig) -> list[str]:
    """Rules spanning a prefill/PD instance's EC config and its vLLM server settings; one line per problem."""
    found: list[str] = []
    if server.role not in (Role.PREFILL, Role.PD):
        found.append(
            problem("vllm.role", server.role, "only prefill and pd consume encoder output", "drop the EC config")
        )
    if ec.ec_role not in ("ec_consumer", "ec_both") or isinstance(ec, ECMooncakeProducer):
        found.append(
            problem(
                "ec_transfer_config.ec_role",
                ec.ec_role,
                "a prefill/PD instance must consume",
                "use ec_consumer",
            )
        )
    if isinstance(ec, ECMooncakeConsumer):
        tp, dp = server.tensor_parallel_size, server.data_parallel_size
        highest = ec.ec_port + dp * tp - 1
        if highest > MAX_PORT:
            found.append(
                problem(
                    "ec_transfer_config.ec_port",
                    ec.ec_port,
                    f"the control ports reach {highest} (ec_port + dp*tp - 1 with tp {tp}, dp {dp})",
                    f"use an ec_port of at most {MAX_PORT - dp * tp + 1}"
                    if dp * tp <= MAX_PORT
                    else "lower tensor_parallel_size or data_parallel_size: no port range holds that many",
                )
            )
        # The control ports are ec_port .. highest, one per rank (ec_ports.ec_consumer_ports), compared as a
        # range: a list of dp*tp ports for arbitrary sizes once took a test process to 23 GB.
        for field, port in (
            ("vllm.port", server.port),
            ("vllm.mooncake_bootstrap_port", server.mooncake_bootstrap_port),
        ):
            if port is not None and ec.ec_port <= port <= highest:
                found.append(
                    problem(
                        field,
                        port,
                        "collides with an EC control port",
                        "move one of them (ports must differ)",
                    )
                )
    return found


# What each vLLM role's KV config must do.
_ROLE_KV: dict[Role, tuple[str, ...]] = {
    Role.PREFILL: ("kv_producer", "kv_both"),
    Role.DECODE: ("kv_consumer",),
    Role.PD: ("kv_both",),
}


def check_kv(kv: AnyKVConfig | None, server: VllmServerConfig) -> list[str]:
    """Rules spanning a KV config and its vLLM server settings; one line per problem."""
    role = server.role
    if kv is None:
        if role in (Role.PREFILL, Role.DECODE):
            return [problem("kv_transfer_config", None, f"a {role} instance needs a KV connector", "give a KV config")]
        return []
    if role == Role.ENCODER:
        return [problem("kv_transfer_config", kv.kv_connector, "encoders hold no KV cache", "drop it")]
    found: list[str] = []
    if kv.kv_role not in _ROLE_KV[role]:
        found.append(
            problem(
                "kv_transfer_config.kv_role",
                kv.kv_role,
                f"does not fit a {role} instance",
                f"use {_ROLE_KV[role][0]}",
            )
        )
    for child in connectors_of(kv):
        if isinstance(child, MooncakeConnectorConfig) and role == Role.PD:
            found.append(
                problem(
                    "kv_transfer_config",
                    child.kv_connector,
                    "P2P transfer needs a prefill/decode split",
                    "use MooncakeStoreConnector",
                )
            )
        if isinstance(child, MooncakeConnectorConfig) and child.kv_role == "kv_producer":
            found.extend(_bootstrap_problems(server))
        if isinstance(child, MooncakeConnectorConfig) and child.kv_role == "kv_consumer":
            found.extend(_consumer_bootstrap_problems(server))
        if isinstance(child, MooncakeStoreConnectorConfig):
            found.extend(_store_problems(child.kv_connector_extra_config, server))
    return found


def _bootstrap_problems(server: VllmServerConfig) -> list[str]:
    """MooncakeConnector's bootstrap side channel listens on VLLM_MOONCAKE_BOOTSTRAP_PORT + d*tp for DP
    replica d (vLLM 0.33 get_mooncake_side_channel_port); it must not take the HTTP port or leave 1..65535."""
    base = server.mooncake_bootstrap_port or DEFAULT_BOOTSTRAP_PORT
    tp, dp = server.tensor_parallel_size, server.data_parallel_size
    ports = range(base, base + (dp - 1) * tp + 1, tp)
    if server.port in ports:
        return [
            problem(
                "vllm.mooncake_bootstrap_port",
                base,
                f"MooncakeConnector's bootstrap port collides with the HTTP port {server.port}",
                "give each its own port",
            )
        ]
    if ports[-1] > MAX_PORT:
        return [
            problem(
                "vllm.mooncake_bootstrap_port",
                base,
                f"the DP replicas' bootstrap ports reach {ports[-1]}",
                "use a lower port",
            )
        ]
    return []


def _consumer_bootstrap_problems(server: VllmServerConfig) -> list[str]:
    """vLLM (0.32 and 0.33) starts the bootstrap server and registers with it only when the worker is not a
    kv_consumer; a decoder dials the prefill's server from kv_transfer_params, so a port here is never used."""
    if server.mooncake_bootstrap_port is None:
        return []
    return [
        problem(
            "vllm.mooncake_bootstrap_port",
            server.mooncake_bootstrap_port,
            "a MooncakeConnector kv_consumer runs no bootstrap server (only the prefill does)",
            "drop it",
        )
    ]


def _store_problems(extra: MooncakeStoreExtra, server: VllmServerConfig) -> list[str]:
    field = "kv_transfer_config.kv_connector_extra_config"
    tp = server.tensor_parallel_size
    found: list[str] = []
    store_tp = extra.effective_store_tp()
    # vLLM silently falls back to rank-local keys (no sharing across TP sizes) when this does not hold.
    if store_tp is not None and (store_tp < tp or store_tp % tp != 0):
        name = "prefill_tp_sizes" if extra.enable_store_tp_lcm else "store_tp_size"
        found.append(
            problem(
                f"{field}.{name}",
                store_tp,
                f"the store TP must be >= the local tensor_parallel_size {tp} and a multiple of it",
                "use the LCM of every prefiller's and decoder's TP",
            )
        )
    if extra.prefill_tp_sizes is not None and server.role == Role.PREFILL and tp not in extra.prefill_tp_sizes:
        found.append(
            problem(
                f"{field}.prefill_tp_sizes",
                list(extra.prefill_tp_sizes),
                f"does not list this prefiller's tensor_parallel_size {tp}",
                "list every prefiller's TP, the same list everywhere",
            )
        )
    if server.prefix_caching_hash_algo in HASH_SEED_ALGOS and server.python_hash_seed is None:
        found.append(
            problem(
                "vllm.python_hash_seed",
                None,
                f"prefix_caching_hash_algo {server.prefix_caching_hash_algo} seeds block hashes per process, "
                "so store sharers never match",
                "set one PYTHONHASHSEED for every instance sharing the store",
            )
        )
    return found
