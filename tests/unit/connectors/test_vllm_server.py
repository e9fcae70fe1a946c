"""The per-role vLLM server: exact argv and env, every rule's message, owned flags never overridden."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import ValidationError

from epd_connectors.config.ec_transfer import ECExampleConnectorConfig, ECMooncakeConsumer, ECMooncakeProducer
from epd_connectors.config.kv_transfer import (
    ExampleKVConnectorConfig,
    MooncakeConnectorConfig,
    MooncakeStoreConnectorConfig,
)
from epd_connectors.config.media import DOMAINS_FLAG, LOCAL_PATH_FLAG, NO_HOST, REDIRECTS_ENV
from epd_connectors.config.transfer_rules import check_transfers
from epd_connectors.config.vllm import OWNED_FLAGS, VllmServerConfig

pytestmark = pytest.mark.unit

MODEL = "/models/qwen2-vl"


def make(role: str, **fields: Any) -> VllmServerConfig:
    return VllmServerConfig(role=role, model=MODEL, **fields)


def rejection(**fields: Any) -> str:
    fields.setdefault("role", "prefill")
    fields.setdefault("model", MODEL)
    with pytest.raises(ValidationError) as info:
        VllmServerConfig(**fields)
    return str(info.value)


def value_of(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


# --- argv ------------------------------------------------------------------------------------------------


def test_encoder_argv() -> None:
    ec = ECMooncakeProducer(ec_buffer_device="cpu", ec_connector_extra_config={"mooncake_protocol": "tcp"})
    server = make("encoder", served_model_name="qwen", port=8001, dtype="bfloat16", block_size=32)
    assert server.argv(ec) == [
        "--model", MODEL,
        "--served-model-name", "qwen",
        "--host", "0.0.0.0",
        "--port", "8001",
        "--dtype", "bfloat16",
        "--tensor-parallel-size", "1",
        "--pipeline-parallel-size", "1",
        "--data-parallel-size", "1",
        "--block-size", "32",
        "--max-num-batched-tokens", "114688",
        "--mm-processor-cache-gb", "4",
        "--mm-encoder-only",
        "--enforce-eager",
        "--no-enable-prefix-caching",
        "--ec-transfer-config", ec.to_cli_json(),
    ]  # fmt: skip


def test_encoder_choices_can_be_relaxed_but_not_inverted() -> None:
    ec = ECMooncakeProducer()
    argv = make("encoder", mm_encoder_only=False, max_num_batched_tokens=4096, enforce_eager=True).argv(ec)
    assert "--mm-encoder-only" not in argv
    assert value_of(argv, "--max-num-batched-tokens") == "4096"
    assert argv.count("--enforce-eager") == 1 and "--no-enable-prefix-caching" in argv


def test_prefill_argv_carries_both_transfer_configs() -> None:
    ec = ECMooncakeConsumer(ec_ip="10.0.0.5")
    kv = MooncakeConnectorConfig(kv_role="kv_producer")
    argv = make("prefill", tensor_parallel_size=2, block_size=32).argv(ec, kv)
    assert json.loads(value_of(argv, "--ec-transfer-config")) == json.loads(ec.to_cli_json())
    assert json.loads(value_of(argv, "--kv-transfer-config")) == json.loads(kv.to_cli_json())
    assert value_of(argv, "--tensor-parallel-size") == "2"
    # Language-model roles keep vLLM's own defaults for what the encoder must override.
    for flag in ("--mm-encoder-only", "--enforce-eager", "--max-num-batched-tokens", "--no-enable-prefix-caching"):
        assert flag not in argv


def test_decode_and_pd_argv() -> None:
    kv = MooncakeConnectorConfig(kv_role="kv_consumer")
    argv = make("decode").argv(None, kv)
    assert "--ec-transfer-config" not in argv and "--kv-transfer-config" in argv
    pd = make("pd", enable_prefix_caching=False, enforce_eager=False, mm_processor_cache_gb=0.5)
    argv = pd.argv(ECMooncakeConsumer(), MooncakeStoreConnectorConfig())
    assert "--no-enable-prefix-caching" in argv and "--no-enforce-eager" in argv
    assert value_of(argv, "--mm-processor-cache-gb") == "0.5"


def test_optional_flags() -> None:
    argv = make("pd", enable_lora=True, prefix_caching_hash_algo="xxhash", python_hash_seed=1).argv()
    assert "--enable-lora" in argv
    assert value_of(argv, "--prefix-caching-hash-algo") == "xxhash"


def test_extra_args_come_last() -> None:
    argv = make("pd", extra_args=["--max-num-seqs", "64", "--max-model-len=512"]).argv()
    assert argv[-3:] == ["--max-num-seqs", "64", "--max-model-len=512"]


def test_transfer_configs_that_do_not_fit_are_refused() -> None:
    assert check_transfers(make("encoder"), None, None) == [
        "ec_transfer_config = None: an encoder needs an EC connector. Fix: give one"
    ]
    assert check_transfers(make("decode"), ECMooncakeConsumer(), MooncakeConnectorConfig(kv_role="kv_consumer")) == [
        "ec_transfer_config = 'ECMooncakeConnector': decode gets KV from prefill, not embeddings. Fix: drop it"
    ]


def test_every_problem_across_ec_and_kv_is_reported() -> None:
    reuse = ECMooncakeProducer(ec_connector_extra_config={"cross_encoder_cache": True})
    server = make("encoder", tensor_parallel_size=2)
    problems = check_transfers(server, reuse, MooncakeStoreConnectorConfig(), store_offload=True)
    fields = [line.split(" = ")[0] for line in problems]
    assert fields == [
        "vllm.tensor_parallel_size",
        "vllm.use_v2_model_runner",
        "mooncake.enable_offload",
        "kv_transfer_config",
    ]


def test_vllm_0_34_has_only_model_runner_v2() -> None:
    """0.34 removed Model Runner V1 and refuses VLLM_USE_V2_MODEL_RUNNER=0: the switch is never rendered there,
    and cross-encoder reuse needs none."""
    for value in (True, False):
        assert "vLLM 0.34 has only Model Runner V2" in rejection(vllm_version="0.34", use_v2_model_runner=value)
    newer = make("encoder", vllm_version="0.34")
    assert "VLLM_USE_V2_MODEL_RUNNER" not in newer.env()
    reuse = ECMooncakeProducer(ec_connector_extra_config={"cross_encoder_cache": True})
    assert check_transfers(newer, reuse, None) == []
    assert [p.split(" = ")[0] for p in check_transfers(make("encoder"), reuse, None)] == ["vllm.use_v2_model_runner"]


def test_consumer_rules_run_through_check_transfers() -> None:
    example = ECExampleConnectorConfig(ec_role="ec_producer", ec_connector_extra_config={"shared_storage_path": "/e"})
    kv = ExampleKVConnectorConfig(kv_role="kv_producer", kv_connector_extra_config={"shared_storage_path": "/k"})
    assert check_transfers(make("prefill"), example, kv) == [
        "ec_transfer_config.ec_role = 'ec_producer': a prefill/PD instance must consume. Fix: use ec_consumer"
    ]


# --- env -------------------------------------------------------------------------------------------------


def test_env() -> None:
    assert make("pd").env() == {}
    server = make("prefill", use_v2_model_runner=True, mooncake_bootstrap_port=8998, python_hash_seed=0)
    assert server.env() == {
        "VLLM_USE_V2_MODEL_RUNNER": "1",
        "VLLM_MOONCAKE_BOOTSTRAP_PORT": "8998",
        "PYTHONHASHSEED": "0",
    }
    assert make("pd", use_v2_model_runner=False).env() == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    # The pod's own IP comes from the downward API, never from us.
    assert "VLLM_HOST_IP" not in server.env()


# --- rules -----------------------------------------------------------------------------------------------


def test_model_must_be_given() -> None:
    assert "model = '': is empty. Fix: give the model" in rejection(model="")
    assert "served_model_name = ' ': is empty. Fix: give the served model name" in rejection(served_model_name=" ")
    assert "host = '': is empty. Fix: give the host" in rejection(host="")


@pytest.mark.parametrize("field", ["model", "served_model_name", "host"])
def test_flag_values_do_not_look_like_flags(field: str) -> None:
    message = rejection(**{field: "--x"})
    assert f"{field} = '--x': starts with '-' (argparse would take it for a flag). Fix: rename it" in message


@pytest.mark.parametrize("field", ["port", "mooncake_bootstrap_port"])
@pytest.mark.parametrize("port", [0, 70000])
def test_ports(field: str, port: int) -> None:
    assert f"{field} = {port}: is not a TCP port. Fix: use a port in 1..65535" in rejection(**{field: port})


@pytest.mark.parametrize(
    "field",
    ["tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "block_size", "max_num_batched_tokens"],
)
def test_sizes_are_at_least_one(field: str) -> None:
    assert f"{field} = 0: must be at least 1. Fix: use 1 or more" in rejection(**{field: 0})


@pytest.mark.parametrize("value", [-1.0, float("inf")])
def test_processor_cache_is_finite_and_not_negative(value: float) -> None:
    message = rejection(mm_processor_cache_gb=value)
    assert f"mm_processor_cache_gb = {value!r}: must be a finite number >= 0. Fix:" in message


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_python_hash_seed_range(seed: int) -> None:
    assert f"python_hash_seed = {seed}: is outside 0..4294967295. Fix:" in rejection(python_hash_seed=seed)


def test_encoders_run_eager() -> None:
    message = rejection(role="encoder", enforce_eager=False)
    assert "enforce_eager = False: encoders must run eager. Fix: leave it unset or true" in message


def test_encoders_have_no_prefix_caching() -> None:
    message = rejection(role="encoder", enable_prefix_caching=True)
    assert "enable_prefix_caching = True: encoders hold no KV cache to cache. Fix:" in message


@pytest.mark.parametrize("role", ["prefill", "decode", "pd"])
def test_encoder_only_is_for_encoders(role: str) -> None:
    message = rejection(role=role, mm_encoder_only=True)
    assert (
        f"mm_encoder_only = True: a {role} instance needs the language model. Fix: set it on encoders only" in message
    )


def test_bootstrap_port_differs_from_http_port() -> None:
    message = rejection(port=9000, mooncake_bootstrap_port=9000)
    assert "mooncake_bootstrap_port = 9000: equals the HTTP port. Fix: use another port" in message


def test_role_is_a_closed_choice() -> None:
    assert "role" in rejection(role="router")


@pytest.mark.parametrize(
    ("arg", "flag"),
    [
        ("--port", "--port"),
        ("--port=9000", "--port"),
        ("--tensor_parallel_size", "--tensor-parallel-size"),
        ("-tp", "-tp"),
        ("--kv-transfer-config.kv_role", "--kv-transfer-config"),
        ("--ec_transfer_config={}", "--ec-transfer-config"),
        ("--enable-prefix-caching", "--enable-prefix-caching"),
        ("--no-enforce-eager", "--no-enforce-eager"),
        ("--served-model", "--served-model-name"),
        ("--max-num-batched", "--max-num-batched-tokens"),
        ("--config", "--config"),
    ],
)
def test_extra_args_cannot_override_owned_flags(arg: str, flag: str) -> None:
    message = rejection(extra_args=[arg, "1"])
    assert f"extra_args = {arg!r}: would override {flag}, which the operator sets (field {OWNED_FLAGS[flag]})" in (
        message
    )
    assert f"Fix: set {OWNED_FLAGS[flag]} instead of passing {flag}" in message


@pytest.mark.parametrize(
    "args", [["--max-num-seqs", "8"], ["--gpu-memory-utilization=0.5"], ["-O3"], ["--trust-remote-code"]]
)
def test_other_extra_args_pass(args: list[str]) -> None:
    assert make("pd", extra_args=args).extra_args == tuple(args)


# --- arbitrary input ---------------------------------------------------------------------------------------

_values = st.none() | st.booleans() | st.integers(-5, 70000) | st.floats() | st.text(max_size=6)
_field_names = st.sampled_from(
    [
        "role", "model", "port", "dtype", "tensor_parallel_size", "data_parallel_size", "block_size",
        "max_num_batched_tokens", "mm_processor_cache_gb", "mm_encoder_only", "enforce_eager",
        "enable_prefix_caching", "python_hash_seed", "mooncake_bootstrap_port", "use_v2_model_runner", "bogus",
    ]
)  # fmt: skip


@given(st.dictionaries(_field_names, _values, max_size=6))
@example({"tensor_parallel_size": 70000, "data_parallel_size": 70000})  # once took a run to 23 GB (listed ports)
def test_arbitrary_settings_validate_or_fail_cleanly(data: dict[str, Any]) -> None:
    fields: dict[str, Any] = {"role": "pd", "model": MODEL, **data}
    try:
        server = VllmServerConfig(**fields)
    except ValidationError:
        return
    ec = ECMooncakeConsumer() if server.role != "decode" else None
    problems = check_transfers(server, ec, None)
    if problems:
        assert all(". Fix: " in line for line in problems)
        return
    argv = server.argv(ec)
    assert VllmServerConfig.model_validate_json(server.model_dump_json()) == server
    assert argv[:2] == ["--model", server.model]


_arg = st.sampled_from(sorted(OWNED_FLAGS)) | st.text(alphabet="-_abcdeilmnoprstz=.", max_size=14)


@given(st.lists(_arg, max_size=5))
def test_no_extra_arg_duplicates_an_owned_flag(args: list[str]) -> None:
    try:
        server = make("pd", extra_args=args)
    except ValidationError as exc:
        assert "would override" in str(exc)
        return
    argv = server.argv(ECMooncakeConsumer())
    # Normalised as vLLM does ('_' -> '-'), no owned flag appears twice and no extra arg abbreviates one.
    names = ["--" + a[2:].split("=")[0].split(".")[0].replace("_", "-") if a.startswith("--") else a for a in argv]
    for flag in OWNED_FLAGS:
        assert names.count(flag) <= 1
    for name in names[len(argv) - len(args) :]:
        assert not (name.startswith("--") and len(name) > 2 and any(f.startswith(name) for f in OWNED_FLAGS))


def test_ec_consumers_accept_embeds_items_and_nothing_else_does() -> None:
    """The proxy rewrites media items to *_embeds; vLLM 0.33 refuses those unless --enable-mm-embeds is set."""
    pd = VllmServerConfig(role="pd", model="/m")
    assert "--enable-mm-embeds" in pd.argv(ECMooncakeConsumer())
    assert "--enable-mm-embeds" not in pd.argv()
    assert "--no-enable-mm-embeds" in pd.model_copy(update={"enable_mm_embeds": False}).argv(ECMooncakeConsumer())
    encoder = VllmServerConfig(role="encoder", model="/m")
    assert not any("mm-embeds" in arg for arg in encoder.argv(ECMooncakeProducer()))
    with pytest.raises(ValidationError, match="--enable-mm-embeds"):
        VllmServerConfig(role="pd", model="/m", extra_args=["--enable-mm-embeds"])


def test_media_access_is_vllms_own_allow_lists_and_no_redirect_gets_round_them() -> None:
    anywhere = make("encoder")
    assert DOMAINS_FLAG not in anywhere.argv() and REDIRECTS_ENV not in anywhere.env()
    closed = make("encoder", media={"domains": []})
    assert value_of(closed.argv(), DOMAINS_FLAG) == NO_HOST and closed.argv().count(DOMAINS_FLAG) == 1
    assert closed.env()[REDIRECTS_ENV] == "0"
    listed = make("pd", media={"domains": ["a.example.com", "10.0.0.9"], "local_path": "/media"}).argv()
    at = listed.index(DOMAINS_FLAG)
    assert listed[at + 1 : at + 3] == ["a.example.com", "10.0.0.9"] and listed[at + 3].startswith("--")
    assert value_of(listed, LOCAL_PATH_FLAG) == "/media"


@pytest.mark.parametrize(
    ("media", "needle"),
    [
        ({"domains": ["Images.Example.com"]}, "is not a lower-case host name"),
        ({"domains": ["https://a.example.com"]}, "give the host alone"),
        ({"local_path": "media"}, "is not an absolute directory"),
        ({"local_path": "/"}, "is not an absolute directory"),
    ],
)
def test_media_access_refuses_what_vllm_would_never_match(media: dict[str, Any], needle: str) -> None:
    assert needle in rejection(media=media)
