"""EC transfer configs: exact vLLM JSON, every rule's message, and no crash on arbitrary input."""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from epd_connectors.config.base import ConfigError
from epd_connectors.config.ec_transfer import (
    ECExampleConnectorConfig,
    ECMooncakeConsumer,
    ECMooncakeProducer,
    ECTransferConfig,
    check_ec_pair,
    ec_consumer_addresses,
    ec_consumer_control_address,
    ec_consumer_ports,
    parse_ec_transfer_config,
)
from epd_connectors.config.transfer_rules import check_consumer, check_encoder
from epd_connectors.config.vllm import VllmServerConfig

pytestmark = pytest.mark.unit

# The fields of vLLM 0.33.0's ECTransferConfig (vllm/config/ec_transfer.py), read from the wheel; the
# dataclass forbids any other key. mm_encoder_output_widths is init=False (measured at start-up), never set.
VLLM_EC_FIELDS = [
    "ec_connector",
    "engine_id",
    "ec_buffer_device",
    "ec_buffer_size",
    "ec_role",
    "ec_ip",
    "ec_port",
    "ec_connector_extra_config",
    "ec_connector_module_path",
]
# The keys ECMooncakeConnector reads from ec_connector_extra_config (ec_connector/mooncake/config.py,
# mooncake_store_embedding/data.py).
VLLM_MOONCAKE_EXTRA_KEYS = {
    "mooncake_protocol",
    "control_timeout_s",
    "push_wait_timeout_s",
    "cross_encoder_cache",
    "embedding_cache_prefix",
    "embedding_model_identity",
    "store_max_pending_items",
    "store_max_pending_bytes",
    "store_read_buffer_bytes",
}


def encoder(**overrides: Any) -> VllmServerConfig:
    fields: dict[str, Any] = {"role": "encoder", "model": "/models/qwen2-vl", "use_v2_model_runner": True}
    fields.update(overrides)
    return VllmServerConfig(**fields)


def prefill(**overrides: Any) -> VllmServerConfig:
    fields: dict[str, Any] = {"role": "prefill", "model": "/models/qwen2-vl"}
    fields.update(overrides)
    return VllmServerConfig(**fields)


def reuse_producer(**extra: Any) -> ECMooncakeProducer:
    return ECMooncakeProducer(ec_connector_extra_config={"cross_encoder_cache": True, **extra})


def rejection(model: type[Any], **fields: Any) -> str:
    with pytest.raises(ValidationError) as info:
        model(**fields)
    return str(info.value)


# --- rendering -------------------------------------------------------------------------------------------


def test_producer_renders_vllms_keys_and_defaults() -> None:
    data = json.loads(ECMooncakeProducer().to_cli_json())
    assert data == {
        "ec_connector": "ECMooncakeConnector",
        "ec_buffer_device": "cuda",
        "ec_buffer_size": 1_000_000_000,
        "ec_role": "ec_producer",
        "ec_ip": "127.0.0.1",
        "ec_port": 14579,
        "ec_connector_extra_config": {
            "mooncake_protocol": "rdma",
            "control_timeout_s": 30.0,
            "push_wait_timeout_s": 60.0,
            "cross_encoder_cache": False,
            "embedding_cache_prefix": "",
            "store_max_pending_items": 32,
            "store_max_pending_bytes": 2 * 1024**3,
            "store_read_buffer_bytes": 128 * 1024**2,
        },
    }
    assert list(data) == [key for key in VLLM_EC_FIELDS if key in data]
    assert set(data["ec_connector_extra_config"]) <= VLLM_MOONCAKE_EXTRA_KEYS


def test_cli_json_is_one_compact_line() -> None:
    text = ECMooncakeConsumer(ec_ip="10.1.2.3").to_cli_json()
    assert "\n" not in text and ": " not in text


@pytest.mark.parametrize(
    "config",
    [
        ECMooncakeProducer(),
        ECMooncakeProducer(
            engine_id="enc-0",
            ec_buffer_device="cpu",
            ec_buffer_size="2 GiB",
            ec_connector_extra_config={
                "mooncake_protocol": "tcp",
                "cross_encoder_cache": True,
                "embedding_cache_prefix": "qwen2-vl-r1",
                "embedding_model_identity": "Qwen/Qwen2-VL-2B",
                "store_max_pending_bytes": "1 GiB",
            },
        ),
        ECMooncakeConsumer(ec_ip="10.0.0.7", ec_port=20000, ec_connector_extra_config={"push_wait_timeout_s": 5}),
        ECExampleConnectorConfig(ec_role="ec_producer", ec_connector_extra_config={"shared_storage_path": "/ec"}),
        ECExampleConnectorConfig(ec_role="ec_consumer", ec_connector_extra_config={"shared_storage_path": "/ec"}),
    ],
)
def test_json_round_trips_exactly(config: ECMooncakeProducer | ECMooncakeConsumer | ECExampleConnectorConfig) -> None:
    text = config.to_cli_json()
    assert type(config).from_cli_json(text) == config
    assert parse_ec_transfer_config(text) == config
    assert parse_ec_transfer_config(text).to_cli_json() == text
    assert set(json.loads(text)) <= set(VLLM_EC_FIELDS)


def test_union_picks_the_model_from_connector_and_role() -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(ECTransferConfig)
    assert isinstance(
        adapter.validate_python({"ec_connector": "ECMooncakeConnector", "ec_role": "ec_producer"}), ECMooncakeProducer
    )
    assert isinstance(
        adapter.validate_python({"ec_connector": "ECMooncakeConnector", "ec_role": "ec_consumer"}), ECMooncakeConsumer
    )
    example = {
        "ec_connector": "ECExampleConnector",
        "ec_role": "ec_both",
        "ec_connector_extra_config": {"shared_storage_path": "/s"},
    }
    assert isinstance(adapter.validate_python(example), ECExampleConnectorConfig)
    assert adapter.validate_python(ECMooncakeConsumer()) == ECMooncakeConsumer()


def test_size_strings_become_bytes() -> None:
    config = ECMooncakeProducer(
        ec_buffer_size="512 MiB", ec_connector_extra_config={"store_read_buffer_bytes": "64MiB"}
    )
    assert config.ec_buffer_size == 512 * 1024**2
    assert config.ec_connector_extra_config.store_read_buffer_bytes == 64 * 1024**2


# --- single-model rules ----------------------------------------------------------------------------------


def test_buffer_size_must_be_positive() -> None:
    assert "ec_buffer_size = 0: must be positive. Fix:" in rejection(ECMooncakeProducer, ec_buffer_size=0)
    # Negative sizes never get that far: the shared ByteSize type refuses them.
    assert "ec_buffer_size" in rejection(ECMooncakeProducer, ec_buffer_size=-1)


@pytest.mark.parametrize("port", [0, 65536, -5])
def test_ec_port_must_be_a_tcp_port(port: int) -> None:
    assert f"ec_port = {port}: is not a TCP port. Fix: use a port in 1..65535" in rejection(
        ECMooncakeConsumer, ec_port=port
    )


def test_ec_ip_must_not_be_empty() -> None:
    assert "ec_ip = ' ': is empty. Fix: give the pod's IP" in rejection(ECMooncakeConsumer, ec_ip=" ")


@pytest.mark.parametrize("field", ["control_timeout_s", "push_wait_timeout_s"])
@pytest.mark.parametrize("value", [0, -1.5, math.inf, math.nan])
def test_timeouts_must_be_positive_and_finite(field: str, value: float) -> None:
    for model in (ECMooncakeProducer, ECMooncakeConsumer):
        message = rejection(model, ec_connector_extra_config={field: value})
        assert (
            f"ec_connector_extra_config.{field} = {float(value)!r}: must be a positive finite number. Fix:" in message
        )


@pytest.mark.parametrize("field", ["store_max_pending_items", "store_max_pending_bytes", "store_read_buffer_bytes"])
def test_budgets_must_be_positive(field: str) -> None:
    message = rejection(ECMooncakeProducer, ec_connector_extra_config={field: 0})
    assert f"ec_connector_extra_config.{field} = 0: must be positive. Fix: use a value above 0" in message
    assert field in rejection(ECMooncakeProducer, ec_connector_extra_config={field: -1})


def test_read_buffer_must_hold_more_than_the_header() -> None:
    message = rejection(ECMooncakeProducer, ec_connector_extra_config={"store_read_buffer_bytes": 24})
    assert "store_read_buffer_bytes = 24: cannot hold the 24-byte header of any stored embedding. Fix:" in message
    ECMooncakeProducer(ec_connector_extra_config={"store_read_buffer_bytes": 25})


@pytest.mark.parametrize("prefix", ["a@b", "has space"])
def test_embedding_prefix_must_not_hold_key_delimiters(prefix: str) -> None:
    message = rejection(ECMooncakeProducer, ec_connector_extra_config={"embedding_cache_prefix": prefix})
    assert f"embedding_cache_prefix = {prefix!r}: must not contain '@' or whitespace" in message


@pytest.mark.parametrize("identity", ["", "model@v2"])
def test_embedding_identity_must_be_a_plain_identifier(identity: str) -> None:
    message = rejection(ECMooncakeProducer, ec_connector_extra_config={"embedding_model_identity": identity})
    assert f"embedding_model_identity = {identity!r}: must be non-empty and free of '@'" in message


@pytest.mark.parametrize(
    "key", ["cross_encoder_cache", "embedding_cache_prefix", "store_max_pending_items", "store_read_buffer_bytes"]
)
def test_consumer_refuses_producer_settings(key: str) -> None:
    message = rejection(ECMooncakeConsumer, ec_connector_extra_config={key: True})
    assert f"ec_connector_extra_config.{key} = True: is an encoder (producer) setting" in message
    assert "Fix: set it on the encoders' ec_transfer_config only" in message


def test_protocol_and_device_are_closed_choices() -> None:
    assert "mooncake_protocol" in rejection(ECMooncakeProducer, ec_connector_extra_config={"mooncake_protocol": "ib"})
    assert "ec_buffer_device" in rejection(ECMooncakeProducer, ec_buffer_device="tpu")


def test_roles_are_fixed_per_model() -> None:
    assert "ec_role" in rejection(ECMooncakeProducer, ec_role="ec_consumer")
    assert "ec_role" in rejection(ECMooncakeConsumer, ec_role="ec_both")
    assert "ec_role" in rejection(ECExampleConnectorConfig, ec_connector_extra_config={"shared_storage_path": "/s"})


def test_example_connector_needs_an_absolute_shared_path() -> None:
    message = rejection(
        ECExampleConnectorConfig, ec_role="ec_producer", ec_connector_extra_config={"shared_storage_path": "ec"}
    )
    assert "ec_connector_extra_config.shared_storage_path = 'ec': is not an absolute path. Fix:" in message
    assert "shared_storage_path" in rejection(
        ECExampleConnectorConfig, ec_role="ec_producer", ec_connector_extra_config={}
    )


def test_strings_do_not_pass_for_bools_or_numbers() -> None:
    # vLLM reads extra config with .get(): "false" would be truthy there.
    assert "cross_encoder_cache" in rejection(
        ECMooncakeProducer, ec_connector_extra_config={"cross_encoder_cache": "false"}
    )
    assert "ec_port" in rejection(ECMooncakeConsumer, ec_port="15000")


def test_unknown_keys_are_refused_as_vllm_does() -> None:
    assert "ec_rank" in rejection(ECMooncakeProducer, ec_rank=0)
    assert "typo_key" in rejection(ECMooncakeProducer, ec_connector_extra_config={"typo_key": 1})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{not json", "transfer config = '{not json': is not valid JSON"),
        ("[1, 2]", "transfer config = [1, 2]: is not a JSON object"),
        ('{"ec_connector": "ECNixlConnector", "ec_role": "ec_producer"}', "is not a supported EC connector and role"),
        ('{"ec_connector": "ECMooncakeConnector", "ec_role": "ec_both"}', "('ECMooncakeConnector', 'ec_both')"),
    ],
)
def test_parse_names_the_problem(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_ec_transfer_config(text)
    assert expected in str(info.value)


def test_parse_reports_field_errors_with_their_location() -> None:
    text = '{"ec_connector":"ECMooncakeConnector","ec_role":"ec_consumer","ec_port":0}'
    with pytest.raises(ConfigError) as info:
        ECMooncakeConsumer.from_cli_json(text)
    assert info.value.problems == ["ec_port: ec_port = 0: is not a TCP port. Fix: use a port in 1..65535"]


# --- rules spanning the EC config and the vLLM server ------------------------------------------------------


def test_a_plain_encoder_passes() -> None:
    assert check_encoder(ECMooncakeProducer(), encoder()) == []
    assert check_encoder(reuse_producer(), encoder()) == []


def test_encoder_checks_refuse_other_roles() -> None:
    problems = check_encoder(ECMooncakeConsumer(), prefill())
    assert problems == [
        "vllm.role = 'prefill': is not an encoder. Fix: use check_consumer for it",
        "ec_transfer_config.ec_role = 'ec_consumer': an encoder must produce. Fix: use ec_producer",
    ]


@pytest.mark.parametrize("field", ["tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"])
def test_mooncake_producers_need_no_parallelism(field: str) -> None:
    problems = check_encoder(ECMooncakeProducer(), encoder(**{field: 2}))
    assert problems == [f"vllm.{field} = 2: ECMooncakeConnector producers need 1. Fix: scale encoders by replicas"]
    # The example connector has no such limit.
    example = ECExampleConnectorConfig(ec_role="ec_producer", ec_connector_extra_config={"shared_storage_path": "/s"})
    assert check_encoder(example, encoder(**{field: 2})) == []


@pytest.mark.parametrize("runner", [None, False])
def test_cross_encoder_reuse_needs_model_runner_v2(runner: bool | None) -> None:
    problems = check_encoder(reuse_producer(), encoder(use_v2_model_runner=runner))
    assert problems == [
        f"vllm.use_v2_model_runner = {runner!r}: cross_encoder_cache requires Model Runner V2 (left unset vLLM "
        "may fall back to V1). Fix: set it to true (VLLM_USE_V2_MODEL_RUNNER=1)"
    ]
    assert check_encoder(ECMooncakeProducer(), encoder(use_v2_model_runner=runner)) == []


def test_cross_encoder_reuse_refuses_lora() -> None:
    assert check_encoder(reuse_producer(), encoder(enable_lora=True)) == [
        "vllm.enable_lora = True: cross_encoder_cache requires no LoRA. Fix: disable LoRA on encoders"
    ]


def test_cross_encoder_reuse_needs_the_processor_cache() -> None:
    assert check_encoder(reuse_producer(), encoder(mm_processor_cache_gb=0)) == [
        "vllm.mm_processor_cache_gb = 0.0: cross_encoder_cache requires a multimodal processor cache to keep "
        "content identifiers. Fix: set it above 0 (vLLM default 4)"
    ]


def test_cross_encoder_reuse_needs_a_ram_only_store() -> None:
    assert check_encoder(reuse_producer(), encoder(), store_offload=True) == [
        "mooncake.enable_offload = True: cross_encoder_cache requires a RAM-only store. Fix: set enable_offload "
        "false in the encoders' Mooncake JSON"
    ]
    assert check_encoder(reuse_producer(), encoder(), store_offload=None) == [
        "mooncake store = None: cross_encoder_cache requires a Mooncake store (MOONCAKE_CONFIG_PATH) on every "
        "encoder. Fix: configure the store for the encoders"
    ]
    # Without reuse the encoder needs no store at all.
    assert check_encoder(ECMooncakeProducer(), encoder(), store_offload=None) == []


def test_every_cross_encoder_problem_is_reported_at_once() -> None:
    server = encoder(use_v2_model_runner=None, enable_lora=True, mm_processor_cache_gb=0, tensor_parallel_size=2)
    problems = check_encoder(reuse_producer(), server, store_offload=True)
    assert [line.split(" = ")[0] for line in problems] == [
        "vllm.tensor_parallel_size",
        "vllm.use_v2_model_runner",
        "vllm.enable_lora",
        "vllm.mm_processor_cache_gb",
        "mooncake.enable_offload",
    ]


def test_consumer_checks() -> None:
    assert check_consumer(ECMooncakeConsumer(), prefill()) == []
    assert check_consumer(ECMooncakeConsumer(), VllmServerConfig(role="pd", model="/m")) == []
    assert check_consumer(ECMooncakeConsumer(), VllmServerConfig(role="decode", model="/m")) == [
        "vllm.role = 'decode': only prefill and pd consume encoder output. Fix: drop the EC config"
    ]
    assert check_consumer(ECMooncakeProducer(), prefill()) == [
        "ec_transfer_config.ec_role = 'ec_producer': a prefill/PD instance must consume. Fix: use ec_consumer"
    ]


def test_consumer_control_ports_must_fit_below_65536() -> None:
    problems = check_consumer(ECMooncakeConsumer(ec_port=65530), prefill(tensor_parallel_size=4, data_parallel_size=2))
    assert problems == [
        "ec_transfer_config.ec_port = 65530: the control ports reach 65537 (ec_port + dp*tp - 1 with tp 4, dp 2). "
        "Fix: use an ec_port of at most 65528"
    ]
    assert (
        check_consumer(ECMooncakeConsumer(ec_port=65528), prefill(tensor_parallel_size=4, data_parallel_size=2)) == []
    )


def test_consumer_control_ports_must_not_take_other_ports() -> None:
    server = prefill(port=14580, mooncake_bootstrap_port=14581, tensor_parallel_size=2)
    assert check_consumer(ECMooncakeConsumer(ec_port=14579), server) == [
        "vllm.port = 14580: collides with an EC control port. Fix: move one of them (ports must differ)"
    ]
    server = prefill(mooncake_bootstrap_port=14580, tensor_parallel_size=2)
    assert check_consumer(ECMooncakeConsumer(ec_port=14579), server) == [
        "vllm.mooncake_bootstrap_port = 14580: collides with an EC control port. Fix: move one of them (ports must "
        "differ)"
    ]


def test_producer_and_consumer_must_match() -> None:
    assert check_ec_pair(ECMooncakeProducer(), ECMooncakeConsumer()) == []
    tcp = ECMooncakeConsumer(ec_connector_extra_config={"mooncake_protocol": "tcp"})
    assert check_ec_pair(ECMooncakeProducer(), tcp) == [
        "ec_connector_extra_config.mooncake_protocol = ('rdma', 'tcp'): encoder and consumer use different transfer "
        "protocols. Fix: use one protocol on both"
    ]
    example_p = ECExampleConnectorConfig(ec_role="ec_producer", ec_connector_extra_config={"shared_storage_path": "/a"})
    example_c = ECExampleConnectorConfig(ec_role="ec_consumer", ec_connector_extra_config={"shared_storage_path": "/b"})
    assert check_ec_pair(ECMooncakeProducer(), example_c) == [
        "ec_transfer_config.ec_connector = ('ECMooncakeConnector', 'ECExampleConnector'): encoder and consumer use "
        "different connectors. Fix: use one EC connector for the whole deployment"
    ]
    assert check_ec_pair(example_p, example_c) == [
        "ec_connector_extra_config.shared_storage_path = ('/a', '/b'): encoder and consumer look in different "
        "folders. Fix: mount one shared volume at one path on both"
    ]


# --- consumer addresses ------------------------------------------------------------------------------------


def test_control_ports_are_dp_major() -> None:
    # TP rank r of DP replica d listens on ec_port + d*tp + r.
    assert ec_consumer_ports(15000, 2, 3) == [15000, 15001, 15002, 15003, 15004, 15005]
    assert ec_consumer_ports(15000, 1) == [15000]


def test_consumer_addresses() -> None:
    consumer = ECMooncakeConsumer(ec_ip="10.0.0.9", ec_port=15000)
    assert ec_consumer_addresses(consumer, 2, 2) == [
        "tcp://10.0.0.9:15000",
        "tcp://10.0.0.9:15001",
        "tcp://10.0.0.9:15002",
        "tcp://10.0.0.9:15003",
    ]
    assert ec_consumer_control_address(consumer, 2, 1) == "tcp://10.0.0.9:15002"
    assert ec_consumer_control_address(ECMooncakeConsumer(ec_ip="fd00::5"), 1) == "tcp://[fd00::5]:14579"


@pytest.mark.parametrize(("tp", "dp"), [(0, 1), (1, 0)])
def test_control_ports_need_real_sizes(tp: int, dp: int) -> None:
    with pytest.raises(ValueError, match=r"must be at least 1\. Fix: give the consumer's real parallel sizes"):
        ec_consumer_ports(15000, tp, dp)


@given(st.integers(1, 60000), st.integers(1, 8), st.integers(1, 8))
def test_control_ports_are_distinct_and_contiguous(base: int, tp: int, dp: int) -> None:
    ports = ec_consumer_ports(base, tp, dp)
    assert ports == list(range(base, base + tp * dp))


# --- arbitrary input ---------------------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_extra_keys = st.sampled_from([*sorted(VLLM_MOONCAKE_EXTRA_KEYS), "shared_storage_path", "other"])
_fields = st.fixed_dictionaries(
    {"ec_connector": st.sampled_from(["ECMooncakeConnector", "ECExampleConnector", "X"])},
    optional={
        "ec_role": st.sampled_from(["ec_producer", "ec_consumer", "ec_both", "x"]) | _json,
        "ec_buffer_size": _json,
        "ec_port": _json,
        "ec_ip": _json,
        "ec_buffer_device": _json,
        "ec_connector_extra_config": st.dictionaries(_extra_keys, _json, max_size=4) | _json,
        "bogus": _json,
    },
)


@given(_fields)
def test_arbitrary_configs_validate_or_fail_cleanly(data: dict[str, Any]) -> None:
    try:
        config = parse_ec_transfer_config(json.dumps(data))
    except ConfigError as exc:
        assert all(". Fix: " in line or "Input" in line or "Field" in line or "Extra" in line for line in exc.problems)
        return
    # Whatever passed renders to JSON that parses back to itself.
    assert parse_ec_transfer_config(config.to_cli_json()) == config


@given(st.text(max_size=40))
def test_arbitrary_text_fails_cleanly(text: str) -> None:
    with contextlib.suppress(ConfigError):
        parse_ec_transfer_config(text)


@given(
    st.sampled_from(["store_max_pending_items", "store_max_pending_bytes", "store_read_buffer_bytes"]),
    st.integers(max_value=0),
)
def test_no_non_positive_budget_passes(field: str, value: int) -> None:
    with pytest.raises(ValidationError):
        ECMooncakeProducer(ec_connector_extra_config={field: value})


@given(st.sampled_from(["control_timeout_s", "push_wait_timeout_s"]), st.floats(max_value=0) | st.just(math.inf))
def test_no_non_positive_timeout_passes(field: str, value: float) -> None:
    with pytest.raises(ValidationError):
        ECMooncakeConsumer(ec_connector_extra_config={field: value})


@given(st.integers().filter(lambda p: not 1 <= p <= 65535))
def test_no_bad_port_passes(port: int) -> None:
    with pytest.raises(ValidationError):
        ECMooncakeConsumer(ec_port=port)
