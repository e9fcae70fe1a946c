"""KV transfer configs: exact vLLM JSON, the XpYd layout, every rule's message, and no crash on any input."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from epd_connectors.config.base import ConfigError
from epd_connectors.config.kv_transfer import (
    ExampleKVConnectorConfig,
    KVTransferConfig,
    MooncakeConnectorConfig,
    MooncakeStoreConnectorConfig,
    MultiConnectorConfig,
    parse_kv_transfer_config,
    store_tp_lcm,
)
from epd_connectors.config.transfer_rules import check_kv
from epd_connectors.config.vllm import VllmServerConfig

pytestmark = pytest.mark.unit

# The fields of vLLM 0.33.0's KVTransferConfig (vllm/config/kv_transfer.py), read from the wheel; the
# dataclass forbids any other key.
VLLM_KV_FIELDS = [
    "kv_connector",
    "engine_id",
    "kv_buffer_device",
    "kv_role",
    "kv_port",
    "kv_connector_extra_config",
    "kv_connector_module_path",
    "enable_permute_local_kv",
    "kv_load_failure_policy",
]
# Keys vLLM 0.33's Mooncake connectors read from kv_connector_extra_config (mooncake_connector.py and
# mooncake/store/{connector,scheduler,worker}.py).
VLLM_P2P_EXTRA_KEYS = {"mooncake_protocol", "device_name", "num_workers", "bootstrap_server_address"}
VLLM_STORE_EXTRA_KEYS = {
    "cache_prefix",
    "load_async",
    "lookup_async",
    "lookup_rpc_port",
    "save_decode_cache",
    "store_tp_size",
    "enable_store_tp_lcm",
    "prefill_tp_sizes",
    "enable_lookup",
    "preferred_segment",
}


def server(role: str = "prefill", **overrides: Any) -> VllmServerConfig:
    return VllmServerConfig(role=role, model="/models/qwen2-vl", **overrides)


def store(role: str = "kv_both", **extra: Any) -> MooncakeStoreConnectorConfig:
    return MooncakeStoreConnectorConfig(kv_role=role, kv_connector_extra_config=extra)


def xpyd(side: str, **store_extra: Any) -> MultiConnectorConfig:
    """The seed document's XpYd layout: P2P first, the store second."""
    producer = side == "prefill"
    return MultiConnectorConfig(
        kv_role="kv_producer" if producer else "kv_consumer",
        kv_connector_extra_config={
            "connectors": [
                {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer" if producer else "kv_consumer"},
                {
                    "kv_connector": "MooncakeStoreConnector",
                    "kv_role": "kv_both" if producer else "kv_consumer",
                    "kv_connector_extra_config": store_extra,
                },
            ]
        },
    )


def rejection(model: type[Any], **fields: Any) -> str:
    with pytest.raises(ValidationError) as info:
        model(**fields)
    return str(info.value)


# --- rendering -------------------------------------------------------------------------------------------


def test_single_node_offload_is_the_seed_documents_json() -> None:
    data = json.loads(MooncakeStoreConnectorConfig().to_cli_json())
    assert data["kv_connector"] == "MooncakeStoreConnector"
    assert data["kv_role"] == "kv_both"
    assert data["kv_connector_extra_config"] == {
        "cache_prefix": "",
        "load_async": True,
        "lookup_async": False,
        "lookup_rpc_port": 0,
        "save_decode_cache": False,
        "enable_store_tp_lcm": False,
    }
    assert list(data) == [key for key in VLLM_KV_FIELDS if key in data]


def test_xpyd_layout_matches_the_seed_document() -> None:
    prefill = json.loads(xpyd("prefill").to_cli_json())
    assert prefill["kv_connector"] == "MultiConnector" and prefill["kv_role"] == "kv_producer"
    children = prefill["kv_connector_extra_config"]["connectors"]
    assert [(c["kv_connector"], c["kv_role"]) for c in children] == [
        ("MooncakeConnector", "kv_producer"),
        ("MooncakeStoreConnector", "kv_both"),
    ]
    decode = json.loads(xpyd("decode", save_decode_cache=True).to_cli_json())
    children = decode["kv_connector_extra_config"]["connectors"]
    assert [(c["kv_connector"], c["kv_role"]) for c in children] == [
        ("MooncakeConnector", "kv_consumer"),
        ("MooncakeStoreConnector", "kv_consumer"),
    ]
    assert children[1]["kv_connector_extra_config"]["save_decode_cache"] is True
    for child in children:
        assert set(child) <= set(VLLM_KV_FIELDS) and "engine_id" not in child


@pytest.mark.parametrize(
    "config",
    [
        MooncakeStoreConnectorConfig(),
        store("kv_consumer", cache_prefix="qwen-r1", save_decode_cache=True, store_tp_size=4, lookup_rpc_port=7),
        store("kv_both", enable_store_tp_lcm=True, prefill_tp_sizes=[4, 2]),
        MooncakeConnectorConfig(
            kv_role="kv_producer", kv_buffer_device="cpu", kv_connector_extra_config={"mooncake_protocol": "tcp"}
        ),
        ExampleKVConnectorConfig(
            kv_role="kv_consumer",
            engine_id="d0",
            kv_load_failure_policy="recompute",
            kv_connector_extra_config={"shared_storage_path": "/kv"},
        ),
        xpyd("prefill", enable_store_tp_lcm=True, prefill_tp_sizes=(2, 4)),
        xpyd("decode"),
    ],
)
def test_json_round_trips_exactly(config: Any) -> None:
    text = config.to_cli_json()
    assert type(config).from_cli_json(text) == config
    assert parse_kv_transfer_config(text) == config
    assert parse_kv_transfer_config(text).to_cli_json() == text
    data = json.loads(text)
    assert set(data) <= set(VLLM_KV_FIELDS)
    for child in data["kv_connector_extra_config"].get("connectors", [data]):
        extra = set(child["kv_connector_extra_config"])
        if child["kv_connector"] == "MooncakeConnector":
            assert extra <= VLLM_P2P_EXTRA_KEYS
        elif child["kv_connector"] == "MooncakeStoreConnector":
            assert extra <= VLLM_STORE_EXTRA_KEYS


def test_union_picks_the_model_from_the_connector_name() -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(KVTransferConfig)
    assert isinstance(adapter.validate_python({"kv_connector": "MooncakeStoreConnector"}), MooncakeStoreConnectorConfig)
    assert isinstance(adapter.validate_python(xpyd("decode")), MultiConnectorConfig)
    p2p = {"kv_connector": "MooncakeConnector", "kv_role": "kv_consumer"}
    assert isinstance(adapter.validate_python(p2p), MooncakeConnectorConfig)


def test_lists_and_tuples_are_the_same_setting() -> None:
    assert store(enable_store_tp_lcm=True, prefill_tp_sizes=[4, 2]) == store(
        enable_store_tp_lcm=True, prefill_tp_sizes=(4, 2)
    )


# --- store TP --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sizes", "lcm"), [([4, 2], 4), ([1], 1), ([2, 3], 6), ((4, 6, 8), 24)])
def test_store_tp_lcm(sizes: list[int], lcm: int) -> None:
    assert store_tp_lcm(sizes) == lcm


@pytest.mark.parametrize("sizes", [[], [0], [2, -4], [True]])
def test_store_tp_lcm_refuses_malformed_lists(sizes: list[int]) -> None:
    with pytest.raises(ValueError, match=r"must be a non-empty list of positive integers\. Fix:"):
        store_tp_lcm(sizes)


@given(st.lists(st.integers(1, 64), min_size=1, max_size=5))
def test_store_tp_lcm_is_a_multiple_of_every_size(sizes: list[int]) -> None:
    lcm = store_tp_lcm(sizes)
    assert all(lcm % size == 0 for size in sizes)
    assert store(enable_store_tp_lcm=True, prefill_tp_sizes=sizes).kv_connector_extra_config.effective_store_tp() == lcm


# --- single-model rules ----------------------------------------------------------------------------------


def test_lcm_needs_the_list() -> None:
    message = rejection(MooncakeStoreConnectorConfig, kv_connector_extra_config={"enable_store_tp_lcm": True})
    assert "kv_connector_extra_config.prefill_tp_sizes = None: enable_store_tp_lcm needs the list. Fix:" in message


def test_list_without_lcm_has_no_effect() -> None:
    message = rejection(MooncakeStoreConnectorConfig, kv_connector_extra_config={"prefill_tp_sizes": [2]})
    assert "prefill_tp_sizes = [2]: has no effect without enable_store_tp_lcm. Fix:" in message


def test_store_tp_size_and_lcm_exclude_each_other() -> None:
    extra = {"enable_store_tp_lcm": True, "prefill_tp_sizes": [2], "store_tp_size": 4}
    message = rejection(MooncakeStoreConnectorConfig, kv_connector_extra_config=extra)
    assert "store_tp_size = 4: is ignored when enable_store_tp_lcm is on. Fix:" in message


@pytest.mark.parametrize("sizes", [[], [0, 2]])
def test_prefill_tp_sizes_must_be_positive(sizes: list[int]) -> None:
    extra = {"enable_store_tp_lcm": True, "prefill_tp_sizes": sizes}
    message = rejection(MooncakeStoreConnectorConfig, kv_connector_extra_config=extra)
    assert f"prefill_tp_sizes = {sizes}: must be a non-empty list of positive TP sizes" in message


def test_store_tp_size_must_be_positive() -> None:
    message = rejection(MooncakeStoreConnectorConfig, kv_connector_extra_config={"store_tp_size": 0})
    assert "kv_connector_extra_config.store_tp_size = 0: must be positive. Fix:" in message


def test_lookup_rpc_port_is_not_negative() -> None:
    message = rejection(MooncakeStoreConnectorConfig, kv_connector_extra_config={"lookup_rpc_port": -1})
    assert "lookup_rpc_port = -1: is negative. Fix: use 0 or more" in message


@pytest.mark.parametrize("prefix", ["a@b", "a b"])
def test_cache_prefix_must_not_hold_key_delimiters(prefix: str) -> None:
    message = rejection(MooncakeStoreConnectorConfig, kv_connector_extra_config={"cache_prefix": prefix})
    assert f"cache_prefix = {prefix!r}: must not contain '@' or whitespace" in message


@pytest.mark.parametrize("role", ["kv_both", "kv_producer"])
def test_save_decode_cache_is_for_consumers(role: str) -> None:
    extra = {"save_decode_cache": True}
    message = rejection(MooncakeStoreConnectorConfig, kv_role=role, kv_connector_extra_config=extra)
    assert (
        f"save_decode_cache = True: only affects a kv_consumer (this is {role}). Fix: set it on decoders only"
        in message
    )


def test_p2p_workers_must_be_positive() -> None:
    extra = {"num_workers": 0}
    message = rejection(MooncakeConnectorConfig, kv_role="kv_producer", kv_connector_extra_config=extra)
    assert "kv_connector_extra_config.num_workers = 0: must be positive. Fix: use 10" in message


def test_p2p_roles_are_producer_or_consumer() -> None:
    assert "kv_role" in rejection(MooncakeConnectorConfig, kv_role="kv_both")
    assert "kv_role" in rejection(MooncakeConnectorConfig)


def test_example_connector_needs_an_absolute_shared_path() -> None:
    extra = {"shared_storage_path": "kv"}
    message = rejection(ExampleKVConnectorConfig, kv_role="kv_producer", kv_connector_extra_config=extra)
    assert "kv_connector_extra_config.shared_storage_path = 'kv': is not an absolute path. Fix:" in message


def test_strings_do_not_pass_for_bools() -> None:
    # vLLM reads extra config with .get(): "false" would be truthy there.
    assert "load_async" in rejection(MooncakeStoreConnectorConfig, kv_connector_extra_config={"load_async": "false"})


def _multi(role: str, *children: dict[str, Any], **fields: Any) -> str:
    return rejection(
        MultiConnectorConfig, kv_role=role, kv_connector_extra_config={"connectors": list(children)}, **fields
    )


P2P_P = {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"}
STORE_BOTH = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}


def test_multi_needs_two_children() -> None:
    assert "connectors = 1: a MultiConnector needs two children. Fix: use the child alone" in _multi(
        "kv_producer", P2P_P
    )


def test_multi_children_are_distinct() -> None:
    assert "lists MooncakeConnector twice. Fix: keep one of each connector" in _multi("kv_producer", P2P_P, P2P_P)


def test_multi_children_carry_no_engine_id() -> None:
    message = _multi("kv_producer", {**P2P_P, "engine_id": "x"}, STORE_BOTH)
    assert "connectors[0].engine_id = 'x': vLLM passes the parent's. Fix: drop it" in message


def test_multi_child_roles_fit_the_parent() -> None:
    consumer_store = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_consumer"}
    message = _multi("kv_producer", P2P_P, consumer_store)
    assert "connectors[1].kv_role = 'kv_consumer': does not fit the MultiConnector's kv_producer. Fix:" in message
    message = _multi("kv_consumer", {"kv_connector": "MooncakeConnector", "kv_role": "kv_consumer"}, STORE_BOTH)
    assert "connectors[1].kv_role = 'kv_both': does not fit the MultiConnector's kv_consumer" in message


def test_multi_children_share_the_buffer_device() -> None:
    message = _multi("kv_producer", P2P_P, STORE_BOTH, kv_buffer_device="cpu")
    assert "connectors[0].kv_buffer_device = None: differs from the parent's 'cpu' (children do not inherit it)" in (
        message
    )


def test_multi_children_do_not_nest() -> None:
    nested = {"kv_connector": "MultiConnector", "kv_role": "kv_producer"}
    assert "connectors" in _multi("kv_producer", P2P_P, nested)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nope", "transfer config = 'nope': is not valid JSON"),
        ("3", "transfer config = 3: is not a JSON object"),
        (
            '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}',
            "kv_connector = 'NixlConnector': is not a supported",
        ),
    ],
)
def test_parse_names_the_problem(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_kv_transfer_config(text)
    assert expected in str(info.value)


# --- rules spanning the KV config and the vLLM server ------------------------------------------------------


def test_roles_need_the_right_kv_side() -> None:
    assert check_kv(xpyd("prefill"), server("prefill")) == []
    assert check_kv(xpyd("decode"), server("decode")) == []
    assert check_kv(MooncakeStoreConnectorConfig(), server("pd")) == []
    assert check_kv(None, server("pd")) == []
    assert check_kv(None, server("encoder")) == []
    assert check_kv(xpyd("prefill"), server("decode")) == [
        "kv_transfer_config.kv_role = 'kv_producer': does not fit a decode instance. Fix: use kv_consumer"
    ]
    assert check_kv(xpyd("decode"), server("prefill")) == [
        "kv_transfer_config.kv_role = 'kv_consumer': does not fit a prefill instance. Fix: use kv_producer"
    ]


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_split_needs_a_kv_connector(role: str) -> None:
    assert check_kv(None, server(role)) == [
        f"kv_transfer_config = None: a {role} instance needs a KV connector. Fix: give a KV config"
    ]


def test_encoders_take_no_kv_connector() -> None:
    assert check_kv(MooncakeStoreConnectorConfig(), server("encoder")) == [
        "kv_transfer_config = 'MooncakeStoreConnector': encoders hold no KV cache. Fix: drop it"
    ]


def test_p2p_needs_a_split() -> None:
    config = MultiConnectorConfig(
        kv_role="kv_both",
        kv_connector_extra_config={"connectors": [P2P_P, STORE_BOTH]},
    )
    assert check_kv(config, server("pd")) == [
        "kv_transfer_config = 'MooncakeConnector': P2P transfer needs a prefill/decode split. Fix: use "
        "MooncakeStoreConnector"
    ]


def test_only_the_p2p_producer_has_a_bootstrap_port() -> None:
    """vLLM starts MooncakeConnector's bootstrap server on the kv_producer only; a decoder's port is unused, and
    a decoder's HTTP port on vLLM's default bootstrap port is no collision."""
    assert check_kv(xpyd("prefill"), server("prefill", mooncake_bootstrap_port=9100)) == []
    assert check_kv(xpyd("decode"), server("decode", mooncake_bootstrap_port=9100)) == [
        "vllm.mooncake_bootstrap_port = 9100: a MooncakeConnector kv_consumer runs no bootstrap server (only the "
        "prefill does). Fix: drop it"
    ]
    assert check_kv(xpyd("decode"), server("decode", port=8998)) == []
    assert check_kv(xpyd("prefill"), server("prefill", port=8998)) != []


def test_store_tp_must_be_a_multiple_of_local_tp() -> None:
    assert check_kv(store("kv_both", store_tp_size=4), server("pd", tensor_parallel_size=2)) == []
    assert check_kv(store("kv_both", store_tp_size=2), server("pd", tensor_parallel_size=4)) == [
        "kv_transfer_config.kv_connector_extra_config.store_tp_size = 2: the store TP must be >= the local "
        "tensor_parallel_size 4 and a multiple of it. Fix: use the LCM of every prefiller's and decoder's TP"
    ]
    assert check_kv(store("kv_both", store_tp_size=6), server("pd", tensor_parallel_size=4)) != []


def test_lcm_store_tp_must_fit_local_tp() -> None:
    decode = server("decode", tensor_parallel_size=8)
    assert check_kv(xpyd("decode", enable_store_tp_lcm=True, prefill_tp_sizes=[4, 2]), decode) == [
        "kv_transfer_config.kv_connector_extra_config.prefill_tp_sizes = 4: the store TP must be >= the local "
        "tensor_parallel_size 8 and a multiple of it. Fix: use the LCM of every prefiller's and decoder's TP"
    ]


def test_prefill_tp_must_be_listed() -> None:
    prefill = server("prefill", tensor_parallel_size=1)
    assert check_kv(xpyd("prefill", enable_store_tp_lcm=True, prefill_tp_sizes=[4, 2]), prefill) == [
        "kv_transfer_config.kv_connector_extra_config.prefill_tp_sizes = [4, 2]: does not list this prefiller's "
        "tensor_parallel_size 1. Fix: list every prefiller's TP, the same list everywhere"
    ]


@pytest.mark.parametrize("algo", ["xxhash", "xxhash_cbor"])
def test_seeded_hashes_need_one_python_hash_seed(algo: str) -> None:
    assert check_kv(MooncakeStoreConnectorConfig(), server("pd", prefix_caching_hash_algo=algo)) == [
        f"vllm.python_hash_seed = None: prefix_caching_hash_algo {algo} seeds block hashes per process, so store "
        "sharers never match. Fix: set one PYTHONHASHSEED for every instance sharing the store"
    ]
    assert (
        check_kv(MooncakeStoreConnectorConfig(), server("pd", prefix_caching_hash_algo=algo, python_hash_seed=7)) == []
    )
    assert check_kv(MooncakeStoreConnectorConfig(), server("pd", prefix_caching_hash_algo="sha256")) == []


def test_bootstrap_port_must_not_take_the_http_port() -> None:
    assert check_kv(xpyd("prefill"), server("prefill", port=8998)) == [
        "vllm.mooncake_bootstrap_port = 8998: MooncakeConnector's bootstrap port collides with the HTTP port 8998. "
        "Fix: give each its own port"
    ]
    # DP replica d uses bootstrap + d*tp.
    dp = server("prefill", port=9002, mooncake_bootstrap_port=9000, tensor_parallel_size=2, data_parallel_size=2)
    assert check_kv(xpyd("prefill"), dp) != []
    high = server("prefill", mooncake_bootstrap_port=65535, data_parallel_size=2)
    assert check_kv(xpyd("prefill"), high) == [
        "vllm.mooncake_bootstrap_port = 65535: the DP replicas' bootstrap ports reach 65536. Fix: use a lower port"
    ]


# --- arbitrary input ---------------------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_extra_key = st.sampled_from([*sorted(VLLM_STORE_EXTRA_KEYS), *sorted(VLLM_P2P_EXTRA_KEYS), "shared_storage_path"])
_connector = st.sampled_from(["MooncakeConnector", "MooncakeStoreConnector", "ExampleConnector", "MultiConnector", "X"])
_role = st.sampled_from(["kv_producer", "kv_consumer", "kv_both", "kv_other"])
_leaf = st.fixed_dictionaries(
    {"kv_connector": _connector},
    optional={
        "kv_role": _role | _json,
        "engine_id": _json,
        "kv_buffer_device": st.sampled_from(["cpu", "cuda"]) | _json,
        "kv_connector_extra_config": st.dictionaries(_extra_key, _json, max_size=4) | _json,
    },
)
_configs = st.one_of(
    _leaf,
    st.fixed_dictionaries(
        {
            "kv_connector": st.just("MultiConnector"),
            "kv_role": _role,
            "kv_connector_extra_config": st.fixed_dictionaries({"connectors": st.lists(_leaf, max_size=3)}),
        }
    ),
)


@given(_configs)
def test_arbitrary_configs_validate_or_fail_cleanly(data: dict[str, Any]) -> None:
    try:
        config = parse_kv_transfer_config(json.dumps(data))
    except ConfigError:
        return
    assert parse_kv_transfer_config(config.to_cli_json()) == config
    for role in ("prefill", "decode", "pd", "encoder"):
        assert all(". Fix: " in line for line in check_kv(config, server(role)))


@given(st.text(max_size=40))
def test_arbitrary_text_fails_cleanly(text: str) -> None:
    with contextlib.suppress(ConfigError):
        parse_kv_transfer_config(text)


@given(st.lists(st.integers(-4, 0), min_size=1, max_size=3))
def test_no_non_positive_tp_list_passes(sizes: list[int]) -> None:
    with pytest.raises(ValidationError):
        store(enable_store_tp_lcm=True, prefill_tp_sizes=sizes)


@given(st.integers(1, 16), st.integers(1, 16))
def test_store_tp_rule_agrees_with_vllms_condition(store_tp: int, local_tp: int) -> None:
    problems = check_kv(store("kv_both", store_tp_size=store_tp), server("pd", tensor_parallel_size=local_tp))
    # vLLM 0.33 _select_store_layout shares only when store_tp >= tp and store_tp % tp == 0.
    assert (problems == []) == (store_tp >= local_tp and store_tp % local_tp == 0)
