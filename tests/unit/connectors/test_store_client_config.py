"""mooncake_client (standalone store owner) flags: every rule, argv/env round trip, the derived vLLM JSON."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from epd_connectors.config.mooncake import StoreMode
from epd_connectors.config.store_client import OFFLOAD_PATH_ENV, StoreClientConfig

pytestmark = pytest.mark.unit

GiB = 1024**3


def base_fields(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "host": "10.0.0.9",
        "global_segment_size": "4 GiB",
        "master_server_address": "mooncake-master:50051",
    }
    fields.update(overrides)
    return fields


def rule_message(**overrides: Any) -> str:
    with pytest.raises(ValidationError) as info:
        StoreClientConfig.model_validate(base_fields(**overrides))
    errors = info.value.errors()
    assert len(errors) == 1, errors
    return str(errors[0]["msg"])


def test_argv_spells_every_flag_with_byte_integers() -> None:
    config = StoreClientConfig.model_validate(base_fields(local_buffer_size="16MB", tenant_id="team-a"))
    assert config.argv() == [
        "mooncake_client",
        "--host=10.0.0.9",
        "--port=50052",
        f"--global_segment_size={4 * GiB}",
        f"--local_buffer_size={16 * 1024**2}",
        "--master_server_address=mooncake-master:50051",
        "--metadata_server=P2PHANDSHAKE",
        "--protocol=tcp",
        "--device_names=",
        "--tenant_id=team-a",
        "--enable_offload=false",
        "--threads=1",
        "--enable_http_server=false",
    ]
    assert config.env() == {}


def test_offload_and_http_server() -> None:
    config = StoreClientConfig.model_validate(
        base_fields(enable_offload=True, offload_path="/mnt/ssd", enable_http_server=True, http_port=9400)
    )
    argv = config.argv()
    assert "--enable_offload=true" in argv
    assert argv[-2:] == ["--enable_http_server=true", "--http_port=9400"]
    assert config.env() == {OFFLOAD_PATH_ENV: "/mnt/ssd"}
    assert StoreClientConfig.from_argv(argv, config.env()) == config


def test_requester_config_agrees_with_the_owner() -> None:
    owner = StoreClientConfig.model_validate(
        base_fields(
            protocol="rdma",
            device_name="mlx5_0",
            metadata_server="http://m:8080/metadata",
            tenant_id="t",
            enable_offload=True,
            offload_path="/mnt/ssd",
        )
    )
    requester = owner.requester_config("256 MiB")
    assert requester.to_json_dict() == {
        "metadata_server": "http://m:8080/metadata",
        "master_server_address": "mooncake-master:50051",
        "protocol": "rdma",
        "device_name": "mlx5_0",
        "mode": StoreMode.STANDALONE_STORE.value,
        "global_segment_size": 0,
        "local_buffer_size": 256 * 1024**2,
        "enable_offload": True,
        "tenant_id": "t",
    }


def test_host_rule() -> None:
    msg = rule_message(host="0.0.0.0")
    assert msg.startswith("Value error, host = '0.0.0.0': the client advertises this address to peers")
    assert "Fix: give the pod's own IP" in msg
    msg = rule_message(host="10.0.0.9:50052")
    assert msg.startswith("Value error, host = '10.0.0.9:50052': not a hostname or IP address. Fix:")


def test_segment_rule() -> None:
    msg = rule_message(global_segment_size=0)
    assert msg.startswith("Value error, global_segment_size = 0: a store owner must contribute memory")
    assert "Fix: set a positive size" in msg


@pytest.mark.parametrize("field", ["port", "http_port"])
def test_port_rule(field: str) -> None:
    msg = rule_message(**{field: 70000})
    assert msg == f"Value error, {field} = 70000: is not a TCP port. Fix: use a port in 1..65535"


def test_http_port_collision_rule() -> None:
    msg = rule_message(enable_http_server=True, http_port=50052)
    assert msg.startswith("Value error, http_port = 50052: the HTTP server would collide with the RPC port")


def test_offload_needs_a_path() -> None:
    msg = rule_message(enable_offload=True)
    assert msg.startswith("Value error, offload_path = '': offload needs an absolute directory")
    assert f"Fix: set offload_path (exported as {OFFLOAD_PATH_ENV})" in msg


def test_path_without_offload_is_refused() -> None:
    msg = rule_message(offload_path="/mnt/ssd")
    assert msg.startswith("Value error, offload_path = '/mnt/ssd': an offload directory is ignored")
    assert "Fix: set enable_offload true" in msg


def test_threads_rule() -> None:
    assert rule_message(threads=0) == "Value error, threads = 0: the RPC service needs a thread. Fix: give 1 or more"


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("master_server_address", "master", "not a Mooncake master address"),
        ("metadata_server", "etcd://e:2379", "not a metadata server"),
        ("tenant_id", "_x", "not a valid tenant id"),
        ("device_name", "a b", "not a comma separated list"),
    ],
)
def test_shared_address_rules(field: str, value: str, problem: str) -> None:
    msg = rule_message(**{field: value})
    assert msg.startswith(f"Value error, {field} = {value!r}: {problem}")
    assert "Fix:" in msg


def test_from_argv_refuses_unknown_flags() -> None:
    with pytest.raises(ValueError, match=r"argv = '--hosts=x': not a mooncake_client flag we render\. Fix:"):
        StoreClientConfig.from_argv(["mooncake_client", "--hosts=x"])


_hosts = st.from_regex(r"\A[a-z]([a-z0-9-]{0,8}[a-z0-9])?(\.[a-z][a-z0-9]{0,5}){0,2}\Z")


@st.composite
def valid_clients(draw: st.DrawFn) -> StoreClientConfig:
    offload = draw(st.booleans())
    http = draw(st.booleans())
    port = draw(st.integers(1, 65535))
    return StoreClientConfig(
        host=draw(_hosts),
        port=port,
        global_segment_size=draw(st.integers(1, 2**45)),
        local_buffer_size=draw(st.integers(0, 2**40)),
        master_server_address=f"{draw(_hosts)}:{draw(st.integers(1, 65535))}",
        protocol=draw(st.sampled_from(["tcp", "rdma"])),
        device_name=draw(st.sampled_from(["", "mlx5_0", "mlx5_0,mlx5_1"])),
        tenant_id=draw(st.from_regex(r"\A[a-z0-9][a-z0-9_-]{0,10}\Z")),
        enable_offload=offload,
        offload_path="/mnt/ssd" if offload else "",
        enable_http_server=http,
        http_port=draw(st.integers(1, 65535).filter(lambda p: p != port)),
        threads=draw(st.integers(1, 64)),
    )


@given(valid_clients())
def test_argv_round_trip_is_exact(config: StoreClientConfig) -> None:
    argv = config.argv()
    again = StoreClientConfig.from_argv(argv, config.env())
    if not config.enable_http_server:
        # The port of a disabled HTTP server is not rendered, so it comes back as the default.
        again = again.model_copy(update={"http_port": config.http_port})
    assert again == config
    assert again.argv() == argv


_values = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20))
_fields = st.sampled_from([*StoreClientConfig.model_fields, "extra"])


@given(st.dictionaries(_fields, _values))
def test_arbitrary_settings_validate_or_fail_cleanly(data: dict[str, Any]) -> None:
    try:
        config = StoreClientConfig.model_validate(data)
    except ValidationError:
        return
    assert StoreClientConfig.from_argv(config.argv(), config.env()).global_segment_size > 0
