"""The vLLM-side Mooncake JSON: every rule names field, value and fix; the JSON round-trips exactly."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from epd_connectors.config.mooncake import MooncakeStoreConfig, Protocol, StoreMode

pytestmark = pytest.mark.unit

GiB = 1024**3
VLLM_KEYS = [
    "metadata_server",
    "master_server_address",
    "protocol",
    "device_name",
    "mode",
    "global_segment_size",
    "local_buffer_size",
    "enable_offload",
    "tenant_id",
]


def base_fields(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "metadata_server": "P2PHANDSHAKE",
        "master_server_address": "mooncake-master:50051",
        "protocol": "tcp",
    }
    fields.update(overrides)
    return fields


def rule_message(**overrides: Any) -> str:
    """The one validation message the overrides provoke (exactly one problem expected)."""
    with pytest.raises(ValidationError) as info:
        MooncakeStoreConfig.model_validate(base_fields(**overrides))
    errors = info.value.errors()
    assert len(errors) == 1, errors
    return str(errors[0]["msg"])


def test_defaults_follow_vllm() -> None:
    config = MooncakeStoreConfig.model_validate(base_fields())
    assert config.mode is StoreMode.EMBEDDED
    assert config.global_segment_size == 4 * GiB
    assert config.local_buffer_size == 4 * GiB
    assert config.tenant_id == "default"
    assert config.enable_offload is False
    assert MooncakeStoreConfig.model_validate(base_fields(protocol="rdma")).protocol is Protocol.RDMA


def test_standalone_store_defaults_segment_to_zero() -> None:
    config = MooncakeStoreConfig.model_validate(base_fields(mode="standalone-store"))
    assert config.global_segment_size == 0


def test_renders_every_vllm_key_in_order_with_byte_integers() -> None:
    config = MooncakeStoreConfig.model_validate(
        base_fields(mode="standalone-store", local_buffer_size="512 MiB", tenant_id="team-a", enable_offload=True)
    )
    assert json.loads(config.to_json()) == {
        "metadata_server": "P2PHANDSHAKE",
        "master_server_address": "mooncake-master:50051",
        "protocol": "tcp",
        "device_name": "",
        "mode": "standalone-store",
        "global_segment_size": 0,
        "local_buffer_size": 512 * 1024**2,
        "enable_offload": True,
        "tenant_id": "team-a",
    }
    assert list(config.to_json_dict()) == VLLM_KEYS
    assert config.to_json().endswith("}\n")


def test_reads_a_file_with_size_strings_like_vllm() -> None:
    text = json.dumps(base_fields(global_segment_size="4GB", local_buffer_size="16MB"))
    config = MooncakeStoreConfig.from_json(text)
    assert (config.global_segment_size, config.local_buffer_size) == (4 * GiB, 16 * 1024**2)


def test_setup_kwargs_match_vllm_setup_call() -> None:
    config = MooncakeStoreConfig.model_validate(base_fields(device_name="mlx5_0", tenant_id="t1"))
    assert config.setup_kwargs("10.0.0.7") == {
        "local_hostname": "10.0.0.7",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": 4 * GiB,
        "local_buffer_size": 4 * GiB,
        "protocol": "tcp",
        "rdma_devices": "mlx5_0",
        "master_server_addr": "mooncake-master:50051",
        "tenant_id": "t1",
    }


@pytest.mark.parametrize(
    "address",
    [
        "mooncake-master:50051",
        "10.0.0.5:1",
        "[fd00::5]:50051",
        "etcd://10.0.0.1:2379;10.0.0.2:2379",
        "redis://redis:6379",
        "k8s://default/mooncake-master",
    ],
)
def test_accepts_master_addresses(address: str) -> None:
    assert MooncakeStoreConfig.model_validate(base_fields(master_server_address=address))


@pytest.mark.parametrize(
    "address",
    [
        "mooncake-master",
        "host:0",
        "host:65536",
        "http://h:1",
        "etcd://",
        "k8s://a/b/c",
        "h:50051 ",
        "h:50051\n",
        "h:\uff15\uff10\uff10\uff15\uff11",  # full-width digits
    ],
)
def test_master_address_rule(address: str) -> None:
    msg = rule_message(master_server_address=address)
    assert msg.startswith(f"Value error, master_server_address = {address!r}: not a Mooncake master address")
    assert "Fix: give HOST:PORT" in msg


@pytest.mark.parametrize("server", ["http://master:8080/metadata", "P2PHANDSHAKE"])
def test_accepts_metadata_servers(server: str) -> None:
    assert MooncakeStoreConfig.model_validate(base_fields(metadata_server=server))


@pytest.mark.parametrize(
    "server", ["", "p2phandshake", "http://master:8080", "master:8080/metadata", "http://m:99999/metadata"]
)
def test_metadata_server_rule(server: str) -> None:
    msg = rule_message(metadata_server=server)
    assert f"metadata_server = {server!r}: not a metadata server" in msg
    assert "Fix: use 'P2PHANDSHAKE', or 'http://HOST:PORT/metadata'" in msg


@pytest.mark.parametrize("tenant", ["", "_system", " team", "team a", "a" * 64, "t\x00", "tenant/x", "team\n"])
def test_tenant_rule(tenant: str) -> None:
    msg = rule_message(tenant_id=tenant)
    assert f"tenant_id = {tenant!r}: not a valid tenant id" in msg
    assert "Fix: use a name such as 'default'" in msg


@pytest.mark.parametrize("device", ["mlx5 0", "mlx5_0,", ",mlx5_0", "a;b"])
def test_device_rule(device: str) -> None:
    msg = rule_message(device_name=device)
    assert f"device_name = {device!r}: not a comma separated list of RDMA device names" in msg
    assert "Fix:" in msg


def test_local_buffer_rule() -> None:
    msg = rule_message(local_buffer_size=0)
    assert msg.startswith("Value error, local_buffer_size = 0: vLLM refuses")
    assert "Fix: set a positive size" in msg


def test_embedded_needs_a_segment() -> None:
    msg = rule_message(mode="embedded", global_segment_size=0)
    assert msg.startswith("Value error, global_segment_size = 0: embedded mode needs every rank")
    assert "Fix: set a positive size such as '4 GiB', or use mode 'standalone-store'" in msg


def test_standalone_store_needs_zero_segment() -> None:
    msg = rule_message(mode="standalone-store", global_segment_size="1 GiB")
    assert msg.startswith(f"Value error, global_segment_size = {GiB}: standalone-store mode makes vLLM")
    assert "Fix: set global_segment_size to 0" in msg


def test_offload_must_be_a_real_bool() -> None:
    # vLLM's reader does bool("false") == True; we refuse the string rather than guess.
    with pytest.raises(ValidationError, match="enable_offload"):
        MooncakeStoreConfig.model_validate(base_fields(enable_offload="false"))


def test_unknown_key_is_refused() -> None:
    with pytest.raises(ValidationError, match="global_segment_sise"):
        MooncakeStoreConfig.model_validate(base_fields(global_segment_sise=1))


@given(st.one_of(st.text(max_size=60), st.binary(max_size=60)))
def test_arbitrary_text_parses_or_raises_value_error(text: str | bytes) -> None:
    try:
        config = MooncakeStoreConfig.from_json(text)
    except ValueError:
        return
    assert MooncakeStoreConfig.from_json(config.to_json()) == config


def test_from_json_needs_an_object() -> None:
    with pytest.raises(ValueError, match=r"must hold a JSON object\. Fix:"):
        MooncakeStoreConfig.from_json("[1, 2]")


_hosts = st.from_regex(r"\A[a-z]([a-z0-9-]{0,8}[a-z0-9])?(\.[a-z][a-z0-9]{0,5}){0,2}\Z")
_ports = st.integers(min_value=1, max_value=65535)
_tenants = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,20}\Z")


@st.composite
def valid_configs(draw: st.DrawFn) -> MooncakeStoreConfig:
    mode = draw(st.sampled_from(list(StoreMode)))
    segment = 0 if mode is StoreMode.STANDALONE_STORE else draw(st.integers(1, 2**40))
    metadata = draw(st.one_of(st.just("P2PHANDSHAKE"), st.builds("http://{}:{}/metadata".format, _hosts, _ports)))
    return MooncakeStoreConfig(
        metadata_server=metadata,
        master_server_address=f"{draw(_hosts)}:{draw(_ports)}",
        protocol=draw(st.sampled_from(list(Protocol))),
        device_name=draw(st.sampled_from(["", "mlx5_0", "mlx5_0,mlx5_1"])),
        mode=mode,
        global_segment_size=segment,
        local_buffer_size=draw(st.integers(1, 2**40)),
        enable_offload=draw(st.booleans()),
        tenant_id=draw(_tenants),
    )


@given(valid_configs())
def test_json_round_trip_is_exact(config: MooncakeStoreConfig) -> None:
    text = config.to_json()
    again = MooncakeStoreConfig.from_json(text)
    assert again == config
    assert again.to_json() == text


_json_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=30),
    st.lists(st.integers(), max_size=2),
)


@given(st.dictionaries(st.sampled_from([*VLLM_KEYS, "extra"]), _json_values))
def test_arbitrary_files_validate_or_fail_cleanly(data: dict[str, Any]) -> None:
    try:
        config = MooncakeStoreConfig.model_validate(data)
    except ValidationError:
        return
    assert MooncakeStoreConfig.from_json(config.to_json()) == config


_bad_tenants = st.one_of(
    st.just(""),
    st.text(min_size=1, max_size=10).map(lambda s: "_" + s),
    st.text(min_size=64, max_size=80, alphabet="abc"),
    st.text(min_size=1, max_size=10).filter(lambda s: any(not (c.isascii() and c.isalnum()) for c in s[:1])),
    st.builds("{}{}{}".format, st.just("a"), st.sampled_from(list(" /:@\t\n\x7f\x00é*")), st.text(max_size=5)),
)


@given(_bad_tenants)
def test_invalid_tenants_never_pass(tenant: str) -> None:
    with pytest.raises(ValidationError, match="tenant_id"):
        MooncakeStoreConfig.model_validate(base_fields(tenant_id=tenant))


_bad_addresses = st.one_of(
    _hosts,  # no port
    st.builds("{}:{}".format, _hosts, st.integers(min_value=65536)),
    st.builds("{}:{}".format, _hosts, st.integers(max_value=0)),
    st.builds("{}://{}".format, st.sampled_from(["http", "tcp", "etcd", "redis"]), st.text(" /@", max_size=3)),
    st.text(alphabet=" \t/@#?", min_size=1, max_size=5),
)


@given(_bad_addresses)
def test_invalid_master_addresses_never_pass(address: str) -> None:
    with pytest.raises(ValidationError, match="master_server_address"):
        MooncakeStoreConfig.model_validate(base_fields(master_server_address=address))


@given(st.integers(max_value=0), st.integers(min_value=1, max_value=2**50))
def test_segment_mode_mismatch_never_passes(non_positive: int, positive: int) -> None:
    with pytest.raises(ValidationError, match="global_segment_size"):
        MooncakeStoreConfig.model_validate(base_fields(mode="embedded", global_segment_size=non_positive))
    with pytest.raises(ValidationError, match="global_segment_size"):
        MooncakeStoreConfig.model_validate(base_fields(mode="standalone-store", global_segment_size=positive))
