"""The per-role bundle: round trips, schema, and every rule that ties sections to the role."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from epd_connectors.config.base import ConfigError
from epd_connectors.config.bundle import RoleBundle, bundle_json_schema, load_bundle, parse_bundle

pytestmark = pytest.mark.unit


def _problems(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_bundle(json.dumps(data))
    return str(info.value)


def test_every_sample_bundle_round_trips_exactly(bundles: dict[str, RoleBundle]) -> None:
    for bundle in bundles.values():
        text = bundle.to_json()
        again = parse_bundle(text)
        assert again == bundle
        assert again.to_json() == text


def test_schema_is_exported_and_names_every_section() -> None:
    schema = bundle_json_schema()
    props = schema["properties"]
    for key in ("apiVersion", "role", "master", "store_client", "mooncake", "vllm", "ec_transfer", "kv_transfer"):
        assert key in props
    assert schema["required"] == ["deployment", "role"]


def test_unknown_key_is_refused_with_its_location(bundle_data: dict[str, dict[str, Any]]) -> None:
    data = bundle_data["encoder"]
    data["vllm"]["tensor_paralel_size"] = 2
    assert "vllm.tensor_paralel_size" in _problems(data)


def test_section_of_another_role_is_refused(bundle_data: dict[str, dict[str, Any]]) -> None:
    data = bundle_data["master"]
    data["proxy"] = {"port": 8000}
    assert "proxy = 'set': a master bundle does not use it. Fix: remove proxy" in _problems(data)


def test_missing_required_section_is_named(bundle_data: dict[str, dict[str, Any]]) -> None:
    data = bundle_data["store-client"]
    del data["store_client"]
    assert "store_client = None: a store-client bundle needs it" in _problems(data)


def test_env_may_not_override_a_launcher_owned_variable(bundle_data: dict[str, dict[str, Any]]) -> None:
    data = bundle_data["pd"]
    data["env"] = {"PYTHONHASHSEED": "1"}
    assert "env.PYTHONHASHSEED = '1': is set by epd-launch" in _problems(data)


def test_vllm_role_must_match_bundle_role(bundle_data: dict[str, dict[str, Any]]) -> None:
    data = bundle_data["pd"]
    data["role"] = "prefill"
    assert "vllm.role = 'pd': differs from the bundle's role prefill" in _problems(data)


def test_store_user_without_master_health_is_refused(bundle_data: dict[str, dict[str, Any]]) -> None:
    data = bundle_data["pd"]
    del data["peers"]
    assert "peers.master_health_url = None: a store user must wait for the master" in _problems(data)


def test_store_client_without_master_health_is_refused(bundle_data: dict[str, dict[str, Any]]) -> None:
    data = bundle_data["store-client"]
    del data["peers"]
    assert "peers.master_health_url = None: a store client must wait for the master" in _problems(data)


def test_standalone_encoder_needs_master_metrics(bundle_data: dict[str, dict[str, Any]]) -> None:
    data = bundle_data["encoder"]
    del data["peers"]["master_metrics_url"]
    assert "peers.master_metrics_url = None: encoders of a standalone store wait" in _problems(data)


def test_mooncake_json_without_a_store_user_is_refused(bundle_data: dict[str, dict[str, Any]]) -> None:
    data = bundle_data["pd"]
    del data["kv_transfer"]
    assert "mooncake = 'set': no connector of this role uses the Mooncake store" in _problems(data)


def test_cross_encoder_cache_without_store_is_refused(bundle_data: dict[str, dict[str, Any]]) -> None:
    data = bundle_data["encoder"]
    del data["mooncake"]
    assert "a Mooncake store (MOONCAKE_CONFIG_PATH) on every encoder" in _problems(data)


def test_cross_encoder_cache_with_offload_is_refused(bundle_data: dict[str, dict[str, Any]]) -> None:
    data = bundle_data["encoder"]
    data["mooncake"]["enable_offload"] = True
    assert "mooncake.enable_offload = True: cross_encoder_cache requires a RAM-only store" in _problems(data)


def test_transfer_rules_of_the_server_apply_inside_the_bundle(bundle_data: dict[str, dict[str, Any]]) -> None:
    data = bundle_data["encoder"]
    data["vllm"]["tensor_parallel_size"] = 2
    assert "vllm.tensor_parallel_size = 2: ECMooncakeConnector producers need 1" in _problems(data)


@pytest.mark.parametrize(
    ("roles", "value"),
    [((), "no language-model instances"), (("decode",), "only decode"), (("prefill",), "only prefill")],
)
def test_proxy_without_pd_or_a_whole_split_is_refused(
    bundle_data: dict[str, dict[str, Any]], roles: tuple[str, ...], value: str
) -> None:
    data = bundle_data["proxy"]
    data["peers"] = {"encoders": [{"host": "e", "port": 1}], **{r: [{"host": r, "port": 2}] for r in roles}}
    assert (
        f"peers = {value!r}: the proxy needs pd, or prefill and decode together (a split). "
        "Fix: list the pd endpoints, or the prefill and decode endpoints"
    ) in _problems(data)


@pytest.mark.parametrize("roles", [("pd",), ("prefill", "decode")])
def test_proxy_with_pd_or_a_whole_split_passes(bundle_data: dict[str, dict[str, Any]], roles: tuple[str, ...]) -> None:
    data = bundle_data["proxy"]
    data["peers"] = {"encoders": [{"host": "e", "port": 1}], **{r: [{"host": r, "port": 2}] for r in roles}}
    assert parse_bundle(json.dumps(data)).peers.encoders


def test_the_proxys_consumer_settings_are_whole(bundle_data: dict[str, dict[str, Any]]) -> None:
    """Every consumer endpoint has ec or none does, not both ec and ec_consumers, and a mooncake KV protocol
    knows every prefill's bootstrap port."""
    data = bundle_data["proxy"]
    ec = {"port": 14579, "tensor_parallel_size": 2}
    data["peers"] = {
        "prefill": [{"host": "p0", "port": 1, "ec": ec}, {"host": "p1", "port": 1, "bootstrap_port": 8998}],
        "decode": [{"host": "d", "port": 2}],
        "ec_consumers": ["tcp://p0:14579"],
    }
    data["proxy"]["kv_protocol"] = "mooncake"
    found = _problems(data)
    assert "peers.prefill[*].ec = 'set on [0] only'" in found
    assert "peers.ec_consumers = ['tcp://p0:14579']: the prefill endpoints' ec give the addresses too" in found
    assert "peers.prefill[*].bootstrap_port = 'missing on [0]'" in found
    for endpoint in data["peers"]["prefill"]:
        endpoint.update(ec=ec, bootstrap_port=8998)
    del data["peers"]["ec_consumers"]
    bundle = parse_bundle(json.dumps(data))
    assert bundle.peers.ec_addresses() == ["tcp://p0:14579", "tcp://p1:14579"]
    data["peers"]["pd"] = [{"host": "x", "port": 1, "bootstrap_port": 8998}]
    assert "pd.0.bootstrap_port: Extra inputs are not permitted" in _problems(data)


def test_bad_json_and_unreadable_file_give_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid JSON"):
        parse_bundle("{")
    with pytest.raises(ConfigError, match=r"cannot read .* Fix: mount the role.s bundle ConfigMap there"):
        load_bundle(tmp_path / "absent.json")


def test_every_problem_is_reported_at_once(bundle_data: dict[str, dict[str, Any]]) -> None:
    data = copy.deepcopy(bundle_data["master"])
    data["proxy"] = {}
    data["vllm"] = {"role": "pd", "model": "m"}
    message = _problems(data)
    assert "remove proxy" in message
    assert "remove vllm" in message
