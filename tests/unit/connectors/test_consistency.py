"""The deployment-wide agreement check: each disagreement is reported by field, with the fix."""

from __future__ import annotations

from typing import Any

import pytest

from epd_connectors.config.bundle import RoleBundle
from epd_connectors.config.consistency import check_deployment

pytestmark = pytest.mark.unit


def _check(data: dict[str, dict[str, Any]]) -> list[str]:
    return [str(d) for d in check_deployment({name: RoleBundle.model_validate(d) for name, d in data.items()})]


def test_the_sample_deployment_agrees(bundles: dict[str, RoleBundle]) -> None:
    assert check_deployment(bundles) == []


def test_tenant_mismatch_names_both_fields(bundle_data: dict[str, dict[str, Any]]) -> None:
    bundle_data["pd"]["mooncake"]["tenant_id"] = "other"
    problems = _check(bundle_data)
    assert any(
        p.startswith("tenant id differs between bundles:") and "pd.mooncake.tenant_id = 'other'" in p for p in problems
    )
    assert any("pd.mooncake.tenant_id = 'other': the master's quota policy does not admit" in p for p in problems)


def test_protocol_mismatch(bundle_data: dict[str, dict[str, Any]]) -> None:
    bundle_data["encoder"]["ec_transfer"]["ec_connector_extra_config"]["mooncake_protocol"] = "rdma"
    (problem,) = _check(bundle_data)
    assert "transfer protocol differs" in problem
    assert "encoder.ec_transfer.ec_connector_extra_config.mooncake_protocol = 'rdma'" in problem


def test_kv_cache_prefix_mismatch(bundle_data: dict[str, dict[str, Any]]) -> None:
    second = {**bundle_data["pd"], "vllm": {**bundle_data["pd"]["vllm"], "port": 8003}}
    second["kv_transfer"] = {**second["kv_transfer"], "kv_connector_extra_config": {"cache_prefix": "kv-2"}}
    bundle_data["pd-b"] = second
    problems = _check(bundle_data)
    assert any("KV cache prefix differs" in p and "pd-b.kv_transfer.cache_prefix = 'kv-2'" in p for p in problems)


def test_store_tp_list_mismatch(bundle_data: dict[str, dict[str, Any]]) -> None:
    kv = bundle_data["pd"]["kv_transfer"]["kv_connector_extra_config"]
    second = {**bundle_data["pd"], "kv_transfer": {**bundle_data["pd"]["kv_transfer"]}}
    second["kv_transfer"]["kv_connector_extra_config"] = {**kv, "store_tp_size": 2}
    bundle_data["pd-b"] = second
    assert any("store TP differs" in p for p in _check(bundle_data))


def test_hash_seed_mismatch(bundle_data: dict[str, dict[str, Any]]) -> None:
    bundle_data["pd-b"] = {**bundle_data["pd"], "vllm": {**bundle_data["pd"]["vllm"], "python_hash_seed": 8}}
    assert any("PYTHONHASHSEED differs" in p and "pd-b.vllm.python_hash_seed = 8" in p for p in _check(bundle_data))


def test_embedding_prefix_mismatch(bundle_data: dict[str, dict[str, Any]]) -> None:
    enc = bundle_data["encoder"]
    extra = {**enc["ec_transfer"]["ec_connector_extra_config"], "embedding_cache_prefix": "emb-2"}
    bundle_data["encoder-b"] = {**enc, "ec_transfer": {**enc["ec_transfer"], "ec_connector_extra_config": extra}}
    assert any("embedding cache prefix differs" in p for p in _check(bundle_data))


def test_offload_must_be_on_everywhere_or_nowhere(bundle_data: dict[str, dict[str, Any]]) -> None:
    bundle_data["master"]["master"]["enable_offload"] = True
    (problem,) = _check(bundle_data)
    assert problem.startswith("offload differs between bundles: master.master.enable_offload = True")


def test_master_address_mismatch(bundle_data: dict[str, dict[str, Any]]) -> None:
    bundle_data["store-client"]["store_client"]["master_server_address"] = "elsewhere:50051"
    assert any("store endpoints differ" in p or "store endpoints differs" in p for p in _check(bundle_data))


def test_standalone_store_without_owner(bundle_data: dict[str, dict[str, Any]]) -> None:
    del bundle_data["store-client"]
    assert any("no store-client bundle owns the pool" in p for p in _check(bundle_data))


def test_proxy_roster_must_list_the_consumers_control_addresses(bundle_data: dict[str, dict[str, Any]]) -> None:
    bundle_data["proxy"]["peers"]["ec_consumers"] = ["tcp://epd-pd-0:9999"]
    (problem,) = _check(bundle_data)
    assert "proxy.peers.ec_consumers = ['tcp://epd-pd-0:9999']" in problem
    assert "tcp://epd-pd-0:14579" in problem
