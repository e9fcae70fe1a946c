"""epd-launch's plan (bundle -> argv, env, files, waits) and its --dry-run and error output."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from epd_connectors.config.bundle import POD_IP_PLACEHOLDER, RoleBundle
from epd_connectors.config.mooncake import MooncakeStoreConfig
from epd_connectors.launch import cli
from epd_connectors.launch.plan import LaunchError, plan_launch
from epd_connectors.launch.readiness import Dependency, DependencyTimeoutError, wait_for_all

pytestmark = pytest.mark.unit


def _plan(bundle: RoleBundle, **environ: str) -> Any:
    return plan_launch(bundle, workdir="/run/epd", bundle_path="/etc/epd/bundle.json", environ=environ)


def test_master_plan_writes_the_quota_policy_it_names(bundles: dict[str, RoleBundle]) -> None:
    plan = _plan(bundles["master"])
    assert plan.argv[0] == "mooncake_master"
    assert "--enable_multi_tenants=true" in plan.argv
    assert "--tenant_quota_connector_uri=/var/run/epd/tenant_quota.yaml" in plan.argv
    assert "demo-tenant" in plan.files["/var/run/epd/tenant_quota.yaml"]
    assert plan.waits == []


def test_store_client_advertises_the_pod_ip_and_waits_for_the_master(bundles: dict[str, RoleBundle]) -> None:
    plan = _plan(bundles["store-client"], POD_IP="10.1.2.3")
    assert plan.argv[0] == "mooncake_client"
    assert "--host=10.1.2.3" in plan.argv
    assert "--tenant_id=demo-tenant" in plan.argv
    assert [w.kind for w in plan.waits] == ["master-health"]


def test_store_client_without_pod_ip_keeps_the_bundle_host(bundles: dict[str, RoleBundle]) -> None:
    assert "--host=127.0.0.1" in _plan(bundles["store-client"]).argv


def test_encoder_plan_writes_the_mooncake_json_and_waits_for_owner(bundles: dict[str, RoleBundle]) -> None:
    plan = _plan(bundles["encoder"], POD_IP="10.1.2.4")
    assert plan.argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert plan.env["MOONCAKE_CONFIG_PATH"] == "/run/epd/mooncake_config.json"
    written = MooncakeStoreConfig.from_json(plan.files["/run/epd/mooncake_config.json"])
    assert written == bundles["encoder"].mooncake
    assert plan.env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert plan.env["PYTHONHASHSEED"] == "7"
    assert plan.env["VLLM_HOST_IP"] == "10.1.2.4"
    assert [w.kind for w in plan.waits] == ["master-health", "store-capacity"]
    ec = json.loads(plan.argv[plan.argv.index("--ec-transfer-config") + 1])
    assert ec["ec_role"] == "ec_producer"
    assert ec["ec_connector_extra_config"]["cross_encoder_cache"] is True


def test_consumer_ec_ip_becomes_the_pod_ip(bundles: dict[str, RoleBundle]) -> None:
    plan = _plan(bundles["pd"], POD_IP="10.1.2.5")
    ec = json.loads(plan.argv[plan.argv.index("--ec-transfer-config") + 1])
    assert ec["ec_ip"] == "10.1.2.5"
    kv = json.loads(plan.argv[plan.argv.index("--kv-transfer-config") + 1])
    assert kv["kv_connector"] == "MooncakeStoreConnector"


def test_proxy_plan_runs_epd_proxy_with_the_bundle(bundles: dict[str, RoleBundle]) -> None:
    plan = _plan(bundles["proxy"])
    assert plan.argv == ["epd-proxy", "--bundle", "/etc/epd/bundle.json"]
    assert plan.waits == []


def test_user_env_is_passed_through(bundle_data: dict[str, dict[str, Any]]) -> None:
    bundle_data["pd"]["env"] = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    plan = _plan(RoleBundle.model_validate(bundle_data["pd"]))
    assert plan.env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_dry_run_prints_the_plan_as_json(
    bundles: dict[str, RoleBundle], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bundle.json"
    path.write_text(bundles["encoder"].to_json())
    assert cli.main(["encoder", "--bundle", str(path), "--workdir", str(tmp_path / "w"), "--dry-run"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["env"]["MOONCAKE_CONFIG_PATH"] == str(tmp_path / "w" / "mooncake_config.json")
    assert out["argv"][2] == "vllm.entrypoints.openai.api_server"
    assert not (tmp_path / "w").exists(), "a dry run writes nothing"


def test_invalid_bundle_exits_2_with_one_line_per_problem(
    bundle_data: dict[str, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle_data["encoder"]["vllm"]["tensor_parallel_size"] = 2
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(bundle_data["encoder"]))
    assert cli.main(["encoder", "--bundle", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"epd-launch[encoder]: invalid bundle: {path}: vllm.tensor_parallel_size = 2: "
        "ECMooncakeConnector producers need 1. Fix: scale encoders by replicas"
    ]


def test_wrong_role_exits_2(bundles: dict[str, RoleBundle], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bundle.json"
    path.write_text(bundles["pd"].to_json())
    assert cli.main(["encoder", "--bundle", str(path)]) == 2
    assert "role = 'pd' but launched as 'encoder'" in capsys.readouterr().err


def test_wait_gives_up_at_the_deadline_with_one_clear_line() -> None:
    now = [0.0]
    lines: list[str] = []
    dep = Dependency("master-health", "http://127.0.0.1:9/health", "the Mooncake master")
    with pytest.raises(DependencyTimeoutError) as info:
        wait_for_all(
            [dep],
            deadline_s=3,
            interval_s=1,
            say=lines.append,
            clock=lambda: now[0],
            sleep=lambda s: now.__setitem__(0, now[0] + s),
        )
    assert str(info.value).startswith("gave up after 3s waiting for the Mooncake master at http://127.0.0.1:9/health")
    assert lines and lines[0].startswith("waiting for the Mooncake master")


def test_a_pod_only_address_without_pod_ip_is_one_clear_line(
    bundle_data: dict[str, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle_data["store-client"]["store_client"]["host"] = POD_IP_PLACEHOLDER
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(bundle_data["store-client"]))
    with pytest.raises(LaunchError, match=r"store_client.host = 'pod-ip.invalid'.*Fix: set POD_IP"):
        _plan(RoleBundle.model_validate(bundle_data["store-client"]))
    assert "--host=10.0.0.9" in _plan(RoleBundle.model_validate(bundle_data["store-client"]), POD_IP="10.0.0.9").argv
    assert cli.main(["store-client", "--bundle", str(path), "--dry-run"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("epd-launch[store-client]: cannot start: store_client.host = 'pod-ip.invalid'")


def test_an_ha_master_advertises_its_pod_ip(bundle_data: dict[str, dict[str, Any]]) -> None:
    master = bundle_data["master"]["master"]
    master.update({"rpc_address": POD_IP_PLACEHOLDER, "ha": {"backend": "etcd", "endpoints": ["etcd-0:2379"]}})
    bundle = RoleBundle.model_validate(bundle_data["master"])
    plan = _plan(bundle, POD_IP="10.0.0.7")
    assert "--rpc_address=10.0.0.7" in plan.argv
    assert plan.supervised  # its master has no SIGTERM handler: never PID 1 (tests/store: test_epd_launch)
    with pytest.raises(LaunchError, match=r"master\.rpc_address"):
        _plan(bundle)


def test_only_the_ha_master_runs_supervised(bundles: dict[str, RoleBundle]) -> None:
    assert not any(_plan(bundle, POD_IP="10.0.0.7").supervised for bundle in bundles.values())


def test_consumer_placeholder_needs_pod_ip(bundle_data: dict[str, dict[str, Any]]) -> None:
    bundle_data["pd"]["ec_transfer"]["ec_ip"] = POD_IP_PLACEHOLDER
    with pytest.raises(LaunchError, match=r"ec_transfer\.ec_ip"):
        _plan(RoleBundle.model_validate(bundle_data["pd"]))
