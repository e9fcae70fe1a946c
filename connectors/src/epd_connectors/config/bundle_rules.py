"""The rules that decide whether a bundle's sections fit its role.

Separate from `bundle` so the model stays a plain description and the rules read as one flat list: each check
returns the message of the rule it enforces (field, value, fix) or nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from epd_connectors.config.base import problem
from epd_connectors.config.ec_transfer import ECMooncakeProducer, ECTransferConfig
from epd_connectors.config.kv_transfer import KVTransferConfig, MooncakeStoreConnectorConfig, connectors_of
from epd_connectors.config.mooncake import StoreMode
from epd_connectors.config.transfer_rules import check_transfers

if TYPE_CHECKING:
    from epd_connectors.config.bundle import RoleBundle

# Which sections each role may carry; anything else must be absent, so a bundle can't half-configure a role.
_SECTIONS = ("master", "store_client", "mooncake", "vllm", "ec_transfer", "kv_transfer", "proxy")
_ALLOWED: dict[str, frozenset[str]] = {
    "master": frozenset({"master"}),
    "store-client": frozenset({"store_client"}),
    "encoder": frozenset({"vllm", "ec_transfer", "mooncake"}),
    "prefill": frozenset({"vllm", "ec_transfer", "kv_transfer", "mooncake"}),
    "decode": frozenset({"vllm", "kv_transfer", "mooncake"}),
    "pd": frozenset({"vllm", "ec_transfer", "kv_transfer", "mooncake"}),
    "proxy": frozenset({"proxy"}),
}
_REQUIRED: dict[str, str] = {
    "master": "master",
    "store-client": "store_client",
    "encoder": "vllm",
    "prefill": "vllm",
    "decode": "vllm",
    "pd": "vllm",
    "proxy": "proxy",
}
# Set by the launcher from typed sections; a user env entry must not fight them.
_OWNED_ENV = (
    "MOONCAKE_CONFIG_PATH",
    "PYTHONHASHSEED",
    "VLLM_USE_V2_MODEL_RUNNER",
    "VLLM_MOONCAKE_BOOTSTRAP_PORT",
    "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH",
)


def role_section_problems(bundle: RoleBundle) -> list[str]:
    """Every problem with the bundle as a whole, one message each; empty when it can be launched."""
    role = bundle.role.value
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
    return [
        problem(
            "peers.master_health_url",
            None,
            "a store client must wait for the master (setup() blocks ~90 s without one)",
            "give the master's http://HOST:METRICS_PORT/health",
        )
    ]


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
    if server.role != bundle.role.value:
        found.append(
            problem(
                "vllm.role",
                server.role,
                f"differs from the bundle's role {bundle.role.value}",
                "make them equal",
            )
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
        found.append(
            problem(
                "peers.master_health_url",
                None,
                "a store user must wait for the master (setup() blocks ~90 s without one)",
                "give the master's http://HOST:METRICS_PORT/health",
            )
        )
    standalone = mooncake.mode is StoreMode.STANDALONE_STORE
    if bundle.role.value == "encoder" and standalone and not bundle.peers.master_metrics_url:
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
    if bundle.proxy is None:
        return []
    peers = bundle.peers
    # A decode (kv_consumer) is only half a split: alone it has no prefill to take KV from.
    if peers.pd or (peers.prefill and peers.decode):
        return []
    given = [name for name in ("prefill", "decode") if getattr(peers, name)]
    return [
        problem(
            "peers",
            f"only {' and '.join(given)}" if given else "no language-model instances",
            "the proxy needs pd, or prefill and decode together (a split)",
            "list the pd endpoints, or the prefill and decode endpoints",
        )
    ]
