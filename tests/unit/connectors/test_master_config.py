"""mooncake_master flags and the tenant quota policy: every rule, the argv, the YAML round trip."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from epd_connectors.config.master import HABackend, HAConfig, MasterConfig, SnapshotConfig, TenantQuotaPolicy

pytestmark = pytest.mark.unit

GiB = 1024**3
POLICY = {"tenants": [{"name": "team-a", "quota": "8 GiB"}, {"name": "team-b", "quota": 1024}]}
POLICY_PATH = "/var/run/mooncake/tenant_quota.yaml"


def flags(argv: list[str]) -> dict[str, str]:
    """--name=value pairs of an argv (every flag we render has the = form)."""
    assert all(arg.startswith("--") and "=" in arg for arg in argv[1:]), argv
    pairs = [arg[2:].split("=", 1) for arg in argv[1:]]
    result = dict((name, value) for name, value in pairs)
    assert len(result) == len(pairs), "a flag is rendered twice"
    return result


def master_message(**fields: Any) -> str:
    with pytest.raises(ValidationError) as info:
        MasterConfig.model_validate(fields)
    errors = info.value.errors()
    assert len(errors) == 1, errors
    return str(errors[0]["msg"])


def policy_message(data: Any) -> str:
    with pytest.raises(ValidationError) as info:
        TenantQuotaPolicy.model_validate(data)
    errors = info.value.errors()
    assert len(errors) == 1, errors
    return str(errors[0]["msg"])


def test_default_argv_is_mooncakes_defaults_spelled_out() -> None:
    config = MasterConfig()
    assert config.argv() == [
        "mooncake_master",
        "--rpc_address=0.0.0.0",
        "--rpc_port=50051",
        "--metrics_port=9003",
        "--enable_http_metadata_server=false",
        "--enable_multi_tenants=false",
        "--enable_offload=false",
        "--eviction_high_watermark_ratio=0.9",
        "--eviction_ratio=0.05",
        "--default_kv_lease_ttl=10000",
        "--client_ttl=10",
        "--enable_ha=false",
        "--enable_snapshot=false",
        "--enable_snapshot_restore=false",
    ]
    assert config.files() == {}
    assert config.env() == {}


def test_a_single_masters_snapshots_are_flags_and_their_folder_an_environment_variable() -> None:
    config = MasterConfig(snapshot=SnapshotConfig(interval_s=30, path="/var/run/epd/master-snapshots"))
    parsed = flags(config.argv())
    assert {k: parsed[k] for k in parsed if "snapshot" in k} == {
        "enable_snapshot": "true",
        "enable_snapshot_restore": "true",
        "snapshot_interval_seconds": "30",
        "snapshot_object_store_type": "local",
    }
    assert config.env() == {"MOONCAKE_SNAPSHOT_LOCAL_PATH": "/var/run/epd/master-snapshots"}


def test_snapshots_are_refused_for_ha_masters_and_a_relative_folder() -> None:
    ha = HAConfig(endpoints=("etcd-0:2379",), enable_oplog=True)
    msg = master_message(rpc_address="10.0.0.5", ha=ha, snapshot={"interval_s": 30, "path": "/s"})
    assert "a standby takes over without restoring a snapshot" in msg
    assert "Fix: remove snapshot; keep objects across a failover with ha.enable_oplog" in msg
    with pytest.raises(ValidationError, match=r"snapshot\.path = 'snaps'.*Fix: give an absolute path"):
        SnapshotConfig(interval_s=30, path="snaps")


def test_full_argv_round_trips_through_its_flags() -> None:
    config = MasterConfig(
        rpc_address="10.0.0.5",
        rpc_port=6000,
        metrics_port=6001,
        enable_http_metadata_server=True,
        http_metadata_server_port=6002,
        enable_multi_tenants=True,
        tenant_quota_policy=TenantQuotaPolicy.model_validate(POLICY),
        tenant_quota_policy_path=POLICY_PATH,
        enable_offload=True,
        eviction_high_watermark_ratio=0.8,
        eviction_ratio=0.1,
        default_kv_lease_ttl_ms=5000,
        client_ttl_s=20,
        ha=HAConfig(endpoints=("etcd-0:2379", "etcd-1:2379"), cluster_id="team-a", enable_oplog=True),
    )
    parsed = flags(config.argv("/usr/bin/mooncake_master"))
    assert parsed == {
        "rpc_address": "10.0.0.5",
        "rpc_port": "6000",
        "metrics_port": "6001",
        "enable_http_metadata_server": "true",
        "http_metadata_server_port": "6002",
        "enable_multi_tenants": "true",
        "tenant_quota_connector_type": "file",
        "tenant_quota_connector_uri": POLICY_PATH,
        "enable_offload": "true",
        "eviction_high_watermark_ratio": "0.8",
        "eviction_ratio": "0.1",
        "default_kv_lease_ttl": "5000",
        "client_ttl": "20",
        "enable_ha": "true",
        "enable_snapshot": "false",
        "enable_snapshot_restore": "false",
        "ha_backend_type": "etcd",
        "ha_backend_connstring": "etcd-0:2379;etcd-1:2379",
        "cluster_id": "team-a",
        "enable_oplog": "true",
    }
    rebuilt = MasterConfig(
        rpc_address=parsed["rpc_address"],
        rpc_port=int(parsed["rpc_port"]),
        metrics_port=int(parsed["metrics_port"]),
        enable_http_metadata_server=parsed["enable_http_metadata_server"] == "true",
        http_metadata_server_port=int(parsed["http_metadata_server_port"]),
        enable_multi_tenants=True,
        tenant_quota_policy=TenantQuotaPolicy.from_yaml(config.files()[POLICY_PATH]),
        tenant_quota_policy_path=parsed["tenant_quota_connector_uri"],
        enable_offload=parsed["enable_offload"] == "true",
        eviction_high_watermark_ratio=float(parsed["eviction_high_watermark_ratio"]),
        eviction_ratio=float(parsed["eviction_ratio"]),
        default_kv_lease_ttl_ms=int(parsed["default_kv_lease_ttl"]),
        client_ttl_s=int(parsed["client_ttl"]),
        ha=HAConfig(
            backend=HABackend(parsed["ha_backend_type"]),
            endpoints=tuple(parsed["ha_backend_connstring"].split(";")),
            cluster_id=parsed["cluster_id"],
            enable_oplog=parsed["enable_oplog"] == "true",
        ),
    )
    assert rebuilt == config


def test_urls_and_client_addresses() -> None:
    config = MasterConfig(enable_http_metadata_server=True)
    assert config.health_url("m") == "http://m:9003/health"
    assert config.metrics_url("m") == "http://m:9003/metrics"
    assert config.client_master_address("m") == "m:50051"
    assert config.metadata_server("m") == "http://m:8080/metadata"
    assert MasterConfig().metadata_server("m") == "P2PHANDSHAKE"


@pytest.mark.parametrize(
    ("ha", "connstring", "client"),
    [
        (HAConfig(endpoints=("e1:2379", "e2:2379")), "e1:2379;e2:2379", "etcd://e1:2379;e2:2379"),
        (
            HAConfig(backend=HABackend.REDIS, endpoints=("redis:6379",)),
            "redis://redis:6379",
            "redis://redis:6379",
        ),
        (HAConfig(backend=HABackend.K8S, k8s_lease="ns/mooncake"), "ns/mooncake", "k8s://ns/mooncake"),
    ],
)
def test_ha_backends_render_mooncakes_forms(ha: HAConfig, connstring: str, client: str) -> None:
    config = MasterConfig(rpc_address="10.0.0.5", ha=ha)
    assert flags(config.argv())["ha_backend_connstring"] == connstring
    assert config.client_master_address("ignored") == client


def test_multi_tenancy_needs_policy_and_path() -> None:
    for extra in ({}, {"tenant_quota_policy": POLICY}, {"tenant_quota_policy_path": POLICY_PATH}):
        msg = master_message(enable_multi_tenants=True, **extra)
        assert msg.startswith("Value error, enable_multi_tenants = True: mooncake_master crashes at start")
        assert "Fix: set tenant_quota_policy (the tenants and quotas) and tenant_quota_policy_path" in msg


def test_policy_without_multi_tenancy_is_refused() -> None:
    msg = master_message(tenant_quota_policy=POLICY, tenant_quota_policy_path=POLICY_PATH)
    assert msg.startswith("Value error, tenant_quota_policy = 'set': a quota policy is ignored")
    assert "Fix: set enable_multi_tenants true" in msg


def test_policy_path_must_be_absolute() -> None:
    msg = master_message(tenant_quota_policy_path="quota.yaml")
    assert msg.startswith("Value error, tenant_quota_policy_path = 'quota.yaml': the master resolves")
    assert "Fix: give an absolute path" in msg


@pytest.mark.parametrize("field", ["rpc_port", "metrics_port", "http_metadata_server_port"])
@pytest.mark.parametrize("port", [0, 65536, -1])
def test_port_rule(field: str, port: int) -> None:
    msg = master_message(**{field: port})
    assert msg == f"Value error, {field} = {port}: is not a TCP port. Fix: use a port in 1..65535"


def test_port_collision_rule() -> None:
    msg = master_message(enable_http_metadata_server=True, http_metadata_server_port=9003)
    assert msg.startswith("Value error, ports = [50051, 9003, 9003]: the master's listeners would collide")
    assert "Fix: give rpc_port, metrics_port and http_metadata_server_port distinct values" in msg


def test_rpc_address_rule() -> None:
    msg = master_message(rpc_address="http://m")
    assert msg.startswith("Value error, rpc_address = 'http://m': not a hostname or IP address. Fix:")


@pytest.mark.parametrize("field", ["eviction_ratio", "eviction_high_watermark_ratio"])
@pytest.mark.parametrize("ratio", [-0.1, 1.5])
def test_ratio_rule(field: str, ratio: float) -> None:
    msg = master_message(**{field: ratio})
    assert msg.startswith(f"Value error, {field} = {ratio}: Mooncake aborts on a ratio outside 0..1.")
    assert msg.endswith("Fix: give a value in 0..1")


@pytest.mark.parametrize("field", ["default_kv_lease_ttl_ms", "client_ttl_s"])
def test_ttl_rule(field: str) -> None:
    assert master_message(**{field: 0}) == f"Value error, {field} = 0: must be positive. Fix: give a positive integer"


def test_ha_needs_the_pods_own_rpc_address() -> None:
    msg = master_message(ha={"endpoints": ["etcd:2379"]})
    assert msg.startswith("Value error, rpc_address = '0.0.0.0': an HA master advertises rpc_address")
    assert "Fix: set rpc_address to the pod's own IP" in msg


@pytest.mark.parametrize(
    ("ha", "field"),
    [
        ({"backend": "etcd"}, "ha.endpoints"),
        ({"backend": "redis", "endpoints": ["a:1", "b:2"]}, "ha.endpoints"),
        ({"backend": "etcd", "endpoints": ["a:1"], "k8s_lease": "ns/l"}, "ha.endpoints"),
        ({"backend": "k8s"}, "ha.k8s_lease"),
        ({"backend": "k8s", "k8s_lease": "ns/l", "endpoints": ["a:1"]}, "ha.k8s_lease"),
        ({"backend": "k8s", "k8s_lease": "a/b/c"}, "ha.k8s_lease"),
    ],
)
def test_ha_backend_rule(ha: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        HAConfig.model_validate(ha)
    msg = str(info.value.errors()[0]["msg"])
    assert msg.startswith(f"Value error, {field} = ")
    assert "Fix:" in msg


def test_ha_endpoint_format_rule() -> None:
    with pytest.raises(ValidationError, match=r"ha\.endpoints\[\] = 'etcd': not HOST:PORT\. Fix:"):
        HAConfig(endpoints=("etcd",))


def test_oplog_needs_etcd() -> None:
    with pytest.raises(ValidationError) as info:
        HAConfig(backend=HABackend.REDIS, endpoints=("r:6379",), enable_oplog=True)
    msg = str(info.value.errors()[0]["msg"])
    assert msg.startswith("Value error, ha.enable_oplog = True: Mooncake replicates the oplog only through etcd")
    assert "Fix: use backend etcd, or set enable_oplog false" in msg


def test_policy_yaml_is_what_mooncake_reads() -> None:
    policy = TenantQuotaPolicy.model_validate(POLICY)
    assert yaml.safe_load(policy.to_yaml()) == {
        "version": 1,
        "tenants": [{"name": "team-a", "quota": 8 * GiB}, {"name": "team-b", "quota": 1024}],
    }
    assert TenantQuotaPolicy().to_yaml() == "version: 1\ntenants: []\n"


def test_policy_reads_mooncakes_own_format() -> None:
    # What Mooncake's FormatTenantQuotaPolicyYaml writes back after an admin update (quoted names, bytes).
    text = 'version: 1\n\ntenants:\n  - name: "team-a"\n    quota: 1073741824\n  - name: "b"\n    quota: 2GB\n'
    policy = TenantQuotaPolicy.from_yaml(text)
    assert [(t.name, t.quota) for t in policy.tenants] == [("team-a", GiB), ("b", 2 * GiB)]


def test_policy_version_rule() -> None:
    msg = policy_message({"version": 2})
    assert msg == "Value error, version = 2: Mooncake reads only policy version 1. Fix: set version: 1"


def test_policy_duplicate_rule() -> None:
    msg = policy_message({"tenants": [{"name": "a", "quota": 1}, {"name": "a", "quota": 2}]})
    assert msg == "Value error, tenants = 'a': a tenant is listed twice. Fix: list each tenant name once"


def test_tenant_quota_rules() -> None:
    msg = policy_message({"tenants": [{"name": "a", "quota": 0}]})
    assert msg.startswith("Value error, tenants[].quota = 0: Mooncake refuses a tenant without quota. Fix:")
    msg = policy_message({"tenants": [{"name": "_sys", "quota": 1}]})
    assert msg.startswith("Value error, tenants[].name = '_sys': not a valid tenant id")


def test_policy_yaml_must_be_a_map() -> None:
    with pytest.raises(ValueError, match=r"must be a YAML map\. Fix:"):
        TenantQuotaPolicy.from_yaml("- a\n- b\n")
    with pytest.raises(ValueError, match=r"(?s)not valid YAML .*\. Fix:"):
        TenantQuotaPolicy.from_yaml("version: [1\n")


@given(st.text(max_size=60))
def test_arbitrary_policy_text_parses_or_raises_value_error(text: str) -> None:
    try:
        policy = TenantQuotaPolicy.from_yaml(text)
    except ValueError:
        return
    assert TenantQuotaPolicy.from_yaml(policy.to_yaml()) == policy


_names = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,20}\Z")


@given(st.dictionaries(_names, st.integers(min_value=1, max_value=2**62), max_size=6))
def test_policy_yaml_round_trip_is_exact(quotas: dict[str, int]) -> None:
    policy = TenantQuotaPolicy(tenants=tuple({"name": n, "quota": q} for n, q in quotas.items()))
    text = policy.to_yaml()
    again = TenantQuotaPolicy.from_yaml(text)
    assert again == policy
    assert again.to_yaml() == text


_yaml_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=10)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8,
)


@given(st.dictionaries(st.sampled_from(["version", "tenants", "other"]), _yaml_values))
def test_arbitrary_policies_validate_or_fail_cleanly(data: dict[str, Any]) -> None:
    try:
        policy = TenantQuotaPolicy.model_validate(data)
    except ValidationError:
        return
    assert TenantQuotaPolicy.from_yaml(policy.to_yaml()) == policy


_fields = st.sampled_from(
    [
        "rpc_address",
        "rpc_port",
        "metrics_port",
        "enable_http_metadata_server",
        "http_metadata_server_port",
        "enable_multi_tenants",
        "tenant_quota_policy_path",
        "enable_offload",
        "eviction_ratio",
        "eviction_high_watermark_ratio",
        "default_kv_lease_ttl_ms",
        "client_ttl_s",
        "ha",
    ]
)


@given(st.dictionaries(_fields, _yaml_values | st.floats()))
def test_arbitrary_master_settings_validate_or_fail_cleanly(data: dict[str, Any]) -> None:
    try:
        config = MasterConfig.model_validate(data)
    except ValidationError:
        return
    assert flags(config.argv())["rpc_port"] == str(config.rpc_port)
