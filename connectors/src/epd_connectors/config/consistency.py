"""The deployment-wide check: settings that every bundle of one deployment must agree on.

Each bundle can be valid alone and the deployment still broken: an encoder publishing under one tenant while
the prefill reads another, two cache prefixes, mixed transports. Those fail silently at run time (misses,
stale embeddings), so the operator runs this over every bundle it renders and refuses a disagreement.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from epd_connectors.config.bundle import RoleBundle
from epd_connectors.config.ec_transfer import ECMooncakeConsumer, ECMooncakeProducer, ec_consumer_control_address
from epd_connectors.config.kv_transfer import (
    MooncakeConnectorConfig,
    MooncakeStoreConnectorConfig,
    connectors_of,
    p2p_tp_fits,
)
from epd_connectors.config.roles import Role

Observation = tuple[str, object]
"""(where, value): where is "<bundle name>.<field path>"."""


@dataclass(frozen=True)
class Disagreement:
    """One finding of check_deployment: which rule, and the line a user reads (fields and fix).

    `rule` is stable (a topic of _AGREEMENTS, or one of the RULE_* names below), so a caller that knows which
    of its own settings decides each rule (the operator: a spec field) maps it without reading the message.
    """

    rule: str
    message: str

    def __str__(self) -> str:
        return self.message


RULE_STORE_OWNER = "store owner"
RULE_QUOTA_ADMISSION = "quota admission"
RULE_PROXY_ROSTER = "proxy EC roster"
RULE_P2P_TP = "P2P TP"


def _tenants(name: str, b: RoleBundle) -> Iterator[Observation]:
    if b.mooncake is not None:
        yield f"{name}.mooncake.tenant_id", b.mooncake.tenant_id
    if b.store_client is not None:
        yield f"{name}.store_client.tenant_id", b.store_client.tenant_id


def _protocols(name: str, b: RoleBundle) -> Iterator[Observation]:
    if b.mooncake is not None:
        yield f"{name}.mooncake.protocol", b.mooncake.protocol.value
    if b.store_client is not None:
        yield f"{name}.store_client.protocol", b.store_client.protocol.value
    if isinstance(b.ec_transfer, ECMooncakeProducer | ECMooncakeConsumer):
        yield (
            f"{name}.ec_transfer.ec_connector_extra_config.mooncake_protocol",
            (b.ec_transfer.ec_connector_extra_config.mooncake_protocol),
        )
    for child in connectors_of(b.kv_transfer) if b.kv_transfer is not None else []:
        if isinstance(child, MooncakeConnectorConfig):
            yield (
                f"{name}.kv_transfer.{child.kv_connector}.mooncake_protocol",
                (child.kv_connector_extra_config.mooncake_protocol),
            )


def _store_extras(b: RoleBundle) -> list[MooncakeStoreConnectorConfig]:
    if b.kv_transfer is None:
        return []
    return [c for c in connectors_of(b.kv_transfer) if isinstance(c, MooncakeStoreConnectorConfig)]


def _kv_prefixes(name: str, b: RoleBundle) -> Iterator[Observation]:
    for child in _store_extras(b):
        yield f"{name}.kv_transfer.cache_prefix", child.kv_connector_extra_config.cache_prefix


def _store_tp(name: str, b: RoleBundle) -> Iterator[Observation]:
    for child in _store_extras(b):
        extra = child.kv_connector_extra_config
        sizes = list(extra.prefill_tp_sizes) if extra.prefill_tp_sizes is not None else None
        yield f"{name}.kv_transfer.(store_tp_size, prefill_tp_sizes)", (extra.effective_store_tp(), sizes)


def _embedding_prefixes(name: str, b: RoleBundle) -> Iterator[Observation]:
    ec = b.ec_transfer
    if isinstance(ec, ECMooncakeProducer) and ec.ec_connector_extra_config.cross_encoder_cache:
        extra = ec.ec_connector_extra_config
        yield (
            f"{name}.ec_transfer.(embedding_cache_prefix, embedding_model_identity)",
            (
                extra.embedding_cache_prefix,
                extra.embedding_model_identity,
            ),
        )


def _hash_seeds(name: str, b: RoleBundle) -> Iterator[Observation]:
    if b.vllm is not None:
        yield f"{name}.vllm.python_hash_seed", b.vllm.python_hash_seed


def _offload(name: str, b: RoleBundle) -> Iterator[Observation]:
    if b.master is not None:
        yield f"{name}.master.enable_offload", b.master.enable_offload
    if b.store_client is not None:
        yield f"{name}.store_client.enable_offload", b.store_client.enable_offload
    if b.mooncake is not None:
        yield f"{name}.mooncake.enable_offload", b.mooncake.enable_offload


def _store_endpoints(name: str, b: RoleBundle) -> Iterator[Observation]:
    for section in (b.mooncake, b.store_client):
        if section is not None:
            label = "mooncake" if section is b.mooncake else "store_client"
            yield (
                f"{name}.{label}.(master_server_address, metadata_server)",
                (
                    section.master_server_address,
                    section.metadata_server,
                ),
            )


def _store_modes(name: str, b: RoleBundle) -> Iterator[Observation]:
    if b.mooncake is not None:
        yield f"{name}.mooncake.mode", b.mooncake.mode.value


# (what must agree, how to read it from one bundle, the fix)
_AGREEMENTS: list[tuple[str, Callable[[str, RoleBundle], Iterator[Observation]], str]] = [
    ("tenant id", _tenants, "render every Mooncake JSON and store client with the deployment's one tenant id"),
    ("transfer protocol", _protocols, "use one protocol (rdma or tcp) for the store and every connector"),
    ("KV cache prefix", _kv_prefixes, "give every MooncakeStoreConnector the same cache_prefix"),
    ("store TP", _store_tp, "give every prefiller and decoder the same store_tp_size / prefill_tp_sizes"),
    ("embedding cache prefix", _embedding_prefixes, "give every encoder the same prefix and model identity"),
    ("PYTHONHASHSEED", _hash_seeds, "give every vLLM instance the deployment's one python_hash_seed"),
    ("offload", _offload, "enable offload on the master, the store clients and the vLLM JSON, or on none"),
    ("store endpoints", _store_endpoints, "point every store user at the same master and metadata server"),
    ("store mode", _store_modes, "use one mode (embedded or standalone-store) for every vLLM instance"),
]


AGREEMENT_TOPICS = tuple(topic for topic, _, _ in _AGREEMENTS)
"""The rules that compare one value across bundles (the `rule` of their Disagreements)."""


def check_deployment(bundles: Mapping[str, RoleBundle]) -> list[Disagreement]:
    """Every disagreement between the bundles of one deployment, one line each naming the fields and the fix.

    `bundles` maps a name for each bundle (e.g. its role) to the bundle; the names appear in the messages.
    """
    found: list[Disagreement] = []
    for topic, read, fix in _AGREEMENTS:
        seen = [obs for name, bundle in bundles.items() for obs in read(name, bundle)]
        if len({repr(value) for _, value in seen}) > 1:
            detail = ", ".join(f"{where} = {value!r}" for where, value in seen)
            found.append(Disagreement(topic, f"{topic} differs between bundles: {detail}. Fix: {fix}"))
    found += _store_owner_problems(bundles)
    found += _proxy_roster_problems(bundles)
    found += _p2p_tp_problems(bundles)
    return found


def _p2p_tp_sizes(bundles: Mapping[str, RoleBundle], kv_role: str) -> list[tuple[str, int]]:
    """(bundle name, TP size) of every vLLM bundle with a MooncakeConnector of this kv_role."""
    return [
        (name, b.vllm.tensor_parallel_size)
        for name, b in bundles.items()
        if b.vllm is not None
        and b.kv_transfer is not None
        and any(isinstance(c, MooncakeConnectorConfig) and c.kv_role == kv_role for c in connectors_of(b.kv_transfer))
    ]


def _p2p_tp_problems(bundles: Mapping[str, RoleBundle]) -> list[Disagreement]:
    """Any MooncakeConnector producer may hand KV to any consumer (the proxy pairs them freely), so every pair's
    TP sizes must fit (one divides the other)."""
    return [
        Disagreement(
            RULE_P2P_TP,
            f"{producer}.vllm.tensor_parallel_size = {p_tp} and {consumer}.vllm.tensor_parallel_size = {c_tp}: "
            "MooncakeConnector hands KV over only between TP sizes of which one divides the other (vLLM fails "
            "the first transfer otherwise). Fix: give every prefiller a TP that divides or is a multiple of "
            "every decoder's",
        )
        for producer, p_tp in _p2p_tp_sizes(bundles, "kv_producer")
        for consumer, c_tp in _p2p_tp_sizes(bundles, "kv_consumer")
        if not p2p_tp_fits(p_tp, c_tp)
    ]


def _store_owner_problems(bundles: Mapping[str, RoleBundle]) -> list[Disagreement]:
    standalone = [n for n, b in bundles.items() if b.mooncake is not None and b.mooncake.mode.value != "embedded"]
    owners = [n for n, b in bundles.items() if b.role is Role.STORE_CLIENT]
    found = []
    if standalone and not owners:
        found.append(
            Disagreement(
                RULE_STORE_OWNER,
                f"{standalone[0]}.mooncake.mode = 'standalone-store': no store-client bundle owns the pool. "
                "Fix: add store clients, or use embedded mode",
            )
        )
    multi = [b.master for b in bundles.values() if b.master is not None and b.master.enable_multi_tenants]
    if not multi or multi[0].tenant_quota_policy is None:
        return found
    admitted = {t.name for t in multi[0].tenant_quota_policy.tenants}
    return found + [
        Disagreement(
            RULE_QUOTA_ADMISSION,
            f"{where} = {tenant!r}: the master's quota policy does not admit this tenant. "
            "Fix: add it to master.tenant_quota_policy.tenants",
        )
        for name, b in bundles.items()
        for where, tenant in _tenants(name, b)
        if tenant not in admitted
    ]


def _proxy_roster_problems(bundles: Mapping[str, RoleBundle]) -> list[Disagreement]:
    """A static roster's EC consumer addresses (listed, or derived from the endpoints' ec) must be exactly the
    consumers' control addresses (TP rank 0 of each DP replica: the `consumer_zmq` the proxy gives encoders)."""
    expected: set[str] = set()
    for b in bundles.values():
        if isinstance(b.ec_transfer, ECMooncakeConsumer) and b.vllm is not None:
            tp, dp = b.vllm.tensor_parallel_size, b.vllm.data_parallel_size
            expected.update(ec_consumer_control_address(b.ec_transfer, tp, d) for d in range(dp))
    found = []
    for name, b in bundles.items():
        static = b.proxy is not None and not b.proxy.discover  # discovery derives them from the pods' IPs
        listed = set(b.peers.ec_addresses()) if static else set()
        if b.role is Role.PROXY and listed and listed != expected:
            found.append(
                Disagreement(
                    RULE_PROXY_ROSTER,
                    f"{name}.peers.ec_consumers = {sorted(listed)!r}: differs from the consumers' control "
                    f"addresses {sorted(expected)!r}. Fix: list exactly the addresses derived from each consumer's "
                    "ec_ip/ec_port",
                )
            )
    return found
