"""Properties of render_desired: scaling touches only replicas, a bundle change rolls exactly its roles,
every pod is hardened and runs epd-launch for its role, and the layouts of facts.md come out right."""

from __future__ import annotations

import ast
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from epd_connectors.config.bundle import KVProtocol, RoleBundle, parse_bundle
from epd_connectors.config.consistency import check_deployment
from epd_connectors.config.kv_transfer import MooncakeStoreConnectorConfig, connectors_of
from epd_connectors.config.roles import Role
from epd_operator.api import constants as c
from epd_operator.api.resource import OperatorDefaults, Owner, parse_spec
from epd_operator.render import Desired, render_desired
from epd_operator.render.meta import bundle_hash

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
OWNER = Owner(name="demo", namespace="serving", uid="00000000-0000-4000-8000-000000000002")
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet")


def example(name: str) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())["spec"]
    return spec


CROSS = "e-pd-mooncake-cross-encoder"
OFFLOAD = "e-p-d-store-offload"
SHARED = "e-pd-shared-storage"


def render(spec: dict[str, Any]) -> Desired:
    return render_desired(OWNER, parse_spec(spec), OperatorDefaults())


def by_key(desired: Desired) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in desired.objects}


def workloads(desired: Desired) -> list[dict[str, Any]]:
    return [o for o in desired.objects if o["kind"] in WORKLOAD_KINDS]


def bundles(desired: Desired) -> dict[str, RoleBundle]:
    return {
        o["metadata"]["name"].removesuffix("-bundle"): parse_bundle(o["data"][c.BUNDLE_FILE])
        for o in desired.objects
        if o["kind"] == "ConfigMap"
    }


def pod_hashes(desired: Desired) -> dict[str, str]:
    return {
        w["metadata"]["name"]: w["spec"]["template"]["metadata"]["annotations"][c.ANNOTATION_BUNDLE_HASH]
        for w in workloads(desired)
    }


def changed(before: Desired, after: Desired) -> dict[tuple[str, str], tuple[Any, Any]]:
    a, b = by_key(before), by_key(after)
    assert a.keys() == b.keys(), "the set of objects changed"
    return {k: (a[k], b[k]) for k in a if a[k] != b[k]}


@pytest.mark.parametrize(
    ("name", "path", "workload"),
    [
        (CROSS, ("encoder", "replicas"), ("Deployment", "demo-encoder")),
        (CROSS, ("decode", "replicas"), ("Deployment", "demo-pd")),
        (CROSS, ("proxy", "replicas"), ("Deployment", "demo-proxy")),
        (CROSS, ("store", "clients", "replicas"), ("StatefulSet", "demo-store-client")),
        (OFFLOAD, ("encoder", "replicas"), ("Deployment", "demo-encoder")),
        (OFFLOAD, ("prefill", "replicas"), ("Deployment", "demo-prefill")),
        (OFFLOAD, ("decode", "replicas"), ("Deployment", "demo-decode")),
    ],
)
def test_scaling_a_role_changes_only_its_replicas(name: str, path: tuple[str, ...], workload: tuple[str, str]) -> None:
    spec = example(name)
    section = spec
    for key in path[:-1]:
        section = section.setdefault(key, {})
    section[path[-1]] = 1
    before = render(copy.deepcopy(spec))
    section[path[-1]] = 3
    after = render(spec)
    diff = changed(before, after)
    assert list(diff) == [workload]
    old, new = diff[workload]
    assert (old["spec"]["replicas"], new["spec"]["replicas"]) == (1, 3)
    assert {**old["spec"], "replicas": 3} == new["spec"] and old["metadata"] == new["metadata"]
    assert pod_hashes(before) == pod_hashes(after)


def test_scaling_a_prefill_pool_changes_only_that_pool() -> None:
    spec = example(OFFLOAD)
    before = render(copy.deepcopy(spec))
    spec["prefill"]["additionalPools"][0]["replicas"] = 4
    assert list(changed(before, render(spec))) == [("Deployment", "demo-prefill-tp2")]


def _carries_prefix(bundle: RoleBundle) -> bool:
    ec = bundle.ec_transfer
    reuse = ec is not None and getattr(ec.ec_connector_extra_config, "cross_encoder_cache", False)
    kv = bundle.kv_transfer
    store_kv = kv is not None and any(isinstance(x, MooncakeStoreConnectorConfig) for x in connectors_of(kv))
    return bool(reuse or store_kv)


@pytest.mark.parametrize("name", [CROSS, OFFLOAD, SHARED])
def test_a_new_model_revision_rolls_exactly_the_roles_carrying_prefixes(name: str) -> None:
    spec = example(name)
    before = render(copy.deepcopy(spec))
    spec["model"]["revision"] = "new-revision"
    after = render(spec)
    carriers = {n for n, b in bundles(before).items() if _carries_prefix(b)}
    rolled = {n for n, h in pod_hashes(before).items() if pod_hashes(after)[n] != h}
    assert rolled == carriers
    expected = {CROSS: {"demo-encoder", "demo-pd"}, OFFLOAD: {"demo-prefill", "demo-prefill-tp2", "demo-decode"}}
    assert rolled == expected.get(name, set())
    assert before.derived.kv_cache_prefix != after.derived.kv_cache_prefix or name == SHARED


def test_pod_template_hash_is_the_hash_of_its_configmap_bundle() -> None:
    desired = render(example(OFFLOAD))
    objects = by_key(desired)
    for w in workloads(desired):
        volume = next(v for v in w["spec"]["template"]["spec"]["volumes"] if "configMap" in v)
        data = objects[("ConfigMap", volume["configMap"]["name"])]["data"][c.BUNDLE_FILE]
        assert w["spec"]["template"]["metadata"]["annotations"][c.ANNOTATION_BUNDLE_HASH] == bundle_hash(data)


def test_removing_prefill_gives_pd_objects_and_no_prefill_objects() -> None:
    spec = example(OFFLOAD)
    del spec["prefill"]
    spec["decode"]["kv"] = {"storeOffload": True}
    desired = render(spec)
    roles = {o["metadata"]["labels"][c.LABEL_ROLE] for o in desired.objects}
    assert Role.PD in roles and Role.PREFILL not in roles and Role.DECODE not in roles
    assert [w.role for w in desired.workloads] == ["master", "store-client", "encoder", "pd", "proxy"]
    proxy = bundles(desired)["demo-proxy"]
    assert proxy.peers.pd and not proxy.peers.prefill and not proxy.peers.decode
    assert desired.derived.store_tp_size == 0


@pytest.mark.parametrize("name", [CROSS, OFFLOAD, SHARED])
def test_every_pod_is_hardened_and_runs_epd_launch_for_its_role(name: str) -> None:
    desired = render(example(name))
    for w in workloads(desired):
        pod = w["spec"]["template"]["spec"]
        role = w["metadata"]["labels"][c.LABEL_ROLE]
        assert pod["securityContext"]["runAsNonRoot"] is True
        # Only the proxy talks to the API server (EndpointSlices), under its own ServiceAccount.
        assert pod["automountServiceAccountToken"] is (role == Role.PROXY)
        assert pod.get("serviceAccountName") == (w["metadata"]["name"] if role == Role.PROXY else None)
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
            assert sc["runAsNonRoot"] is True and sc["capabilities"] == {"drop": ["ALL"]}
            assert container["command"][:2] == ["epd-launch", role]
            assert container["command"][2:] == ["--bundle", f"{c.BUNDLE_MOUNT_DIR}/{c.BUNDLE_FILE}"]
            env = {e["name"]: e for e in container["env"]}
            assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
            assert env["EPD_WORKDIR"]["value"] == c.WORK_DIR
            assert {m["mountPath"] for m in container["volumeMounts"]} >= {c.WORK_DIR, c.BUNDLE_MOUNT_DIR}
            assert "readinessProbe" in container and "livenessProbe" in container


@pytest.mark.parametrize("name", [CROSS, OFFLOAD, SHARED])
def test_the_proxy_follows_endpointslices_and_pods_with_a_role_that_allows_only_that(name: str) -> None:
    desired = render(example(name))
    proxy = next(w for w in workloads(desired) if w["metadata"]["labels"][c.LABEL_ROLE] == Role.PROXY)
    account = proxy["spec"]["template"]["spec"]["serviceAccountName"]
    by_kind = {o["kind"]: o for o in desired.objects if o["metadata"]["name"] == account}
    assert set(by_kind) >= {"ServiceAccount", "Role", "RoleBinding"}
    assert by_kind["Role"]["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    ]
    assert by_kind["RoleBinding"]["subjects"][0]["name"] == account
    bundle = bundles(desired)[account]
    assert bundle.proxy is not None and bundle.proxy.discover
    spec = example(name)
    pushed = [e.ec is not None for e in bundle.peers.consumers]
    assert pushed == [spec.get("encoder", {}).get("connector", "mooncake") == "mooncake"] * len(pushed)
    kv = spec.get("prefill", {}).get("kv", {})
    p2p = kv.get("connector") in ("mooncake", "mooncake+store")
    assert (bundle.proxy.kv_protocol is KVProtocol.MOONCAKE) == p2p


def test_objects_come_in_apply_order_with_labels_and_owner() -> None:
    desired = render(example(OFFLOAD))
    kinds = [o["kind"] for o in desired.objects]
    first_workload = next(i for i, k in enumerate(kinds) if k in WORKLOAD_KINDS)
    assert "ConfigMap" not in kinds[first_workload:] and "Service" not in kinds[first_workload:]
    assert [w.role for w in desired.workloads][:2] == ["master", "store-client"]
    assert desired.workloads[-1].role == Role.PROXY and desired.objects[-1]["metadata"]["name"] == "demo-proxy"
    for obj in desired.objects:
        labels = obj["metadata"]["labels"]
        assert labels[c.LABEL_DEPLOYMENT] == "demo" and labels[c.LABEL_MANAGED_BY] == c.MANAGED_BY
        assert {c.LABEL_NAME, c.LABEL_INSTANCE, c.LABEL_COMPONENT, c.LABEL_PART_OF, c.LABEL_ROLE} <= labels.keys()
        assert obj["metadata"]["ownerReferences"] == [OWNER.owner_reference()]


def test_derived_values_reach_status_and_bundles() -> None:
    desired = render(example(OFFLOAD))
    d = desired.derived
    assert (d.tenant_id, d.store_tp_size, d.endpoint) == ("serving.demo", 2, "http://demo-proxy.serving.svc:80")
    for name in ("demo-prefill", "demo-prefill-tp2", "demo-decode"):
        b = bundles(desired)[name]
        assert b.mooncake is not None and b.mooncake.tenant_id == d.tenant_id
        assert b.vllm is not None and b.vllm.python_hash_seed == d.python_hash_seed
        assert b.kv_transfer is not None
        store = next(x for x in connectors_of(b.kv_transfer) if isinstance(x, MooncakeStoreConnectorConfig))
        extra = store.kv_connector_extra_config
        assert (extra.cache_prefix, extra.prefill_tp_sizes, extra.effective_store_tp()) == (
            d.kv_cache_prefix,
            (1, 2),
            2,
        )


def test_gpus_follow_tensor_parallel_size() -> None:
    objects = by_key(render(example(OFFLOAD)))
    for name, gpus in (("demo-encoder", 1), ("demo-prefill", 1), ("demo-prefill-tp2", 2), ("demo-decode", 2)):
        container = objects[("Deployment", name)]["spec"]["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"][c.GPU_RESOURCE] == gpus


def test_offload_is_switched_together_with_a_volume_on_the_clients() -> None:
    desired = render(example(OFFLOAD))
    found = bundles(desired)
    assert found["demo-master"].master is not None and found["demo-master"].master.enable_offload
    client = found["demo-store-client"].store_client
    assert client is not None and client.enable_offload and client.offload_path
    assert all(b.mooncake.enable_offload for b in found.values() if b.mooncake is not None)
    sts = by_key(desired)[("StatefulSet", "demo-store-client")]["spec"]["template"]["spec"]
    assert {"name": "offload", "emptyDir": {"sizeLimit": "500Gi"}} in sts["volumes"]
    assert {"name": "offload", "mountPath": client.offload_path} in sts["containers"][0]["volumeMounts"]


def test_store_client_memory_covers_segment_buffer_and_overhead() -> None:
    spec = example(OFFLOAD)
    container = by_key(render(spec))[("StatefulSet", "demo-store-client")]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"]["memory"] == container["resources"]["limits"]["memory"] == "66Gi"
    spec["store"]["clients"]["resources"] = {"limits": {"memory": "100Gi", "cpu": "4"}}
    container = by_key(render(spec))[("StatefulSet", "demo-store-client")]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"memory": "100Gi", "cpu": "4"}
    assert container["resources"]["requests"]["memory"] == "100Gi"


def test_per_node_store_clients_are_a_daemonset_on_the_selected_nodes() -> None:
    spec = example(CROSS)
    spec["store"]["clients"] = {"perNode": True, "nodeSelector": {"store": "yes"}, "segmentSize": "8GiB"}
    desired = render(spec)
    ds = by_key(desired)[("DaemonSet", "demo-store-client")]
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"store": "yes"}
    assert next(w for w in desired.workloads if w.role == Role.STORE_CLIENT).replicas is None
    assert ("PodDisruptionBudget", "demo-store-client") not in by_key(desired)


def test_tenant_isolation_admits_exactly_the_deployment_tenant() -> None:
    desired = render(example(CROSS))
    master = bundles(desired)["demo-master"].master
    assert master is not None and master.enable_multi_tenants and master.tenant_quota_policy is not None
    assert [(t.name, t.quota) for t in master.tenant_quota_policy.tenants] == [("serving.demo", 48 * 1024**3)]


def test_cross_encoder_reuse_flags() -> None:
    desired = render(example(CROSS))
    encoder = bundles(desired)["demo-encoder"]
    assert encoder.vllm is not None and encoder.vllm.use_v2_model_runner is True
    assert encoder.mooncake is not None and encoder.peers.master_metrics_url
    extra = json.loads(encoder.ec_transfer.to_cli_json())["ec_connector_extra_config"]  # type: ignore[union-attr]
    assert extra["cross_encoder_cache"] is True
    assert extra["embedding_cache_prefix"] == desired.derived.embedding_cache_prefix
    assert "--mm-processor-kwargs" in encoder.vllm.extra_args


def test_proxy_peers_are_service_names_and_no_consumer_addresses() -> None:
    proxy = bundles(render(example(OFFLOAD)))["demo-proxy"]
    assert [e.host for e in proxy.peers.prefill] == ["demo-prefill.serving.svc", "demo-prefill-tp2.serving.svc"]
    assert proxy.peers.ec_consumers == [] and proxy.peers.master_health_url is None


def policies(desired: Desired) -> dict[str, dict[str, Any]]:
    """Each NetworkPolicy's spec by the role it selects."""
    found = {}
    for o in desired.objects:
        if o["kind"] == "NetworkPolicy":
            selector = o["spec"]["podSelector"]["matchLabels"]
            assert selector[c.LABEL_DEPLOYMENT] == "demo" and o["spec"]["policyTypes"] == ["Ingress"]
            found[selector[c.LABEL_ROLE]] = o["spec"]
    return found


def admitted(policy: dict[str, Any], role: str, port: str) -> bool:
    """Whether a pod of this deployment with `role` may reach `port` (a container port name) under `policy`."""
    for rule in policy["ingress"]:
        names = [p["port"] for p in rule.get("ports", [])]
        if names and port not in names:
            continue
        if "from" not in rule:
            return True
        for peer in rule["from"]:
            selector = peer.get("podSelector", {})
            if selector.get("matchLabels") != {c.LABEL_DEPLOYMENT: "demo"} or "namespaceSelector" in peer:
                continue
            if all(e["operator"] == "In" and role in e["values"] for e in selector.get("matchExpressions", [])):
                return True
    return False


def from_anywhere(policy: dict[str, Any], port: str) -> bool:
    """Whether any pod (of any namespace, any deployment) may reach `port`: a rule without `from`, or with an
    empty pod selector."""
    for rule in policy["ingress"]:
        names = [p["port"] for p in rule.get("ports", [])]
        if names and port not in names:
            continue
        if "from" not in rule or any(peer.get("podSelector") == {} for peer in rule["from"]):
            return True
    return False


ALL_ROLES = (Role.MASTER, Role.STORE_CLIENT, "encoder", "prefill", "decode", "pd", "proxy")
TRANSFER_PORT = "any-run-time-port"
"""Stands for the ports Mooncake's transfer engine picks at run time (no container port names them)."""


def test_standalone_store_ports_admit_only_the_store_users() -> None:
    """e-p-d-store-offload: prefill and decode use the store; its encoders hand over P2P (no cross-encoder
    reuse) and the proxy never talks to the store. With cross-encoder reuse the encoders are store users."""
    found = policies(render(example(OFFLOAD)))
    assert set(found) == {Role.MASTER, Role.STORE_CLIENT}, "standalone vLLM pods hold no segment"
    users = {Role.STORE_CLIENT, "prefill", "decode"}
    for port in ("rpc", "metrics"):
        assert not from_anywhere(found[Role.MASTER], port), port
        for role in ALL_ROLES:
            assert admitted(found[Role.MASTER], role, port) == (role in users), (role, port)
    for port in ("rpc", "metrics", TRANSFER_PORT):
        assert not from_anywhere(found[Role.STORE_CLIENT], port), port
        for role in ALL_ROLES:
            assert admitted(found[Role.STORE_CLIENT], role, port) == (role in users), (role, port)
    cross = policies(render(example(CROSS)))
    for role in ALL_ROLES:
        expected = role in {Role.STORE_CLIENT, "encoder", "pd"}
        assert admitted(cross[Role.MASTER], role, "metrics") == expected, role
        assert admitted(cross[Role.STORE_CLIENT], role, TRANSFER_PORT) == expected, role


def test_a_scraper_named_in_the_spec_reaches_only_the_store_metrics_ports() -> None:
    spec = example(OFFLOAD)
    scraper = {"namespaceSelector": {"kubernetes.io/metadata.name": "monitoring"}, "podSelector": {"app": "prom"}}
    spec["store"]["metricsFrom"] = [scraper, {"podSelector": {"app": "agent"}}]
    found = policies(render(spec))
    peers = [{k: {"matchLabels": v} for k, v in scraper.items()}, {"podSelector": {"matchLabels": {"app": "agent"}}}]
    for role in (Role.MASTER, Role.STORE_CLIENT):
        scraping = [rule for rule in found[role]["ingress"] if rule["from"] == peers]
        assert [rule["ports"] for rule in scraping] == [[{"port": "metrics", "protocol": "TCP"}]], role
        assert not from_anywhere(found[role], "metrics") and not admitted(found[role], "proxy", "metrics"), role
    assert all(rule["from"] != peers for rule in policies(render(example(OFFLOAD)))[Role.MASTER]["ingress"])


def test_a_metrics_peer_must_select_something() -> None:
    spec = example(OFFLOAD)
    spec["store"]["metricsFrom"] = [{}]
    with pytest.raises(
        ValueError, match=r"spec\.store\.metricsFrom\[\] = \{\}: a peer needs namespaceSelector or podSelector"
    ):
        parse_spec(spec)


def test_the_master_admits_its_metadata_port_from_store_users_when_it_serves_one() -> None:
    spec = example(OFFLOAD)
    spec["store"]["master"] = {**spec["store"].get("master", {}), "httpMetadataServer": True}
    master = policies(render(spec))[Role.MASTER]
    assert admitted(master, "prefill", "metadata") and not admitted(master, "proxy", "metadata")
    assert not from_anywhere(master, "metadata")


def test_embedded_segment_holders_get_a_policy_that_admits_store_peers_and_keeps_the_api_open() -> None:
    """Embedded mode: every store-using vLLM pod holds a segment, which store peers read over run-time ports;
    the encoders (P2P EC hand-over) hold none and get no policy."""
    spec = example(OFFLOAD)
    spec["store"] = {"mode": "embedded", "protocol": "tcp", "embeddedSegmentSize": "1GiB"}
    found = policies(render(spec))
    holders = {"prefill", "decode"}
    assert set(found) == {Role.MASTER} | holders
    peers = {"encoder", "prefill", "decode", "pd"}
    for holder in holders:
        policy = found[holder]
        for role in ALL_ROLES:
            assert admitted(policy, role, TRANSFER_PORT) == (role in peers), (holder, role)
            assert admitted(policy, role, "kv-bootstrap") == (role in peers | {"proxy"}), (holder, role)
        assert not from_anywhere(policy, TRANSFER_PORT) and not from_anywhere(policy, "kv-bootstrap")
        assert from_anywhere(policy, "http"), "the API and vLLM's /metrics stay reachable, as without a policy"
    for role in ALL_ROLES:
        assert admitted(found[Role.MASTER], role, "rpc") == (role in holders), role


@pytest.mark.parametrize("connector", ["mooncake", "mooncake-store", "mooncake+store", "shared-storage"])
def test_every_kv_connector_renders_consistent_bundles(connector: str) -> None:
    spec = example(OFFLOAD)
    spec["prefill"]["kv"]["connector"] = connector
    spec["sharedStorage"] = {"pvc": {"claimName": "shared"}}
    if "store" not in connector:
        spec["decode"]["kv"] = {}
    desired = render(spec)
    assert check_deployment(bundles(desired)) == []
    decode = bundles(desired)["demo-decode"]
    assert decode.kv_transfer is not None and decode.kv_transfer.kv_role == "kv_consumer"
    shared_mounted = any(
        v["name"] == "shared"
        for v in by_key(desired)[("Deployment", "demo-decode")]["spec"]["template"]["spec"]["volumes"]
    )
    assert shared_mounted == (connector == "shared-storage")


@pytest.mark.parametrize("connector", ["mooncake", "mooncake+store"])
def test_only_prefill_pods_get_the_mooncake_bootstrap_port(connector: str) -> None:
    """vLLM starts MooncakeConnector's bootstrap server on the kv_producer only (MooncakeConnectorWorker, 0.32 and
    0.33): the decode gets neither the variable nor the container or Service port."""
    spec = example(OFFLOAD)
    spec["prefill"]["kv"]["connector"] = connector
    if "store" not in connector:
        spec["decode"]["kv"] = {}
    desired = render(spec)
    objects = by_key(desired)
    for name, role in (("demo-prefill", "prefill"), ("demo-prefill-tp2", "prefill"), ("demo-decode", "decode")):
        bundle = bundles(desired)[name]
        assert bundle.vllm is not None
        container = objects[("Deployment", name)]["spec"]["template"]["spec"]["containers"][0]
        port_names = {p["name"] for p in container["ports"]}
        service_ports = {p["name"] for p in objects[("Service", name)]["spec"]["ports"]}
        launched_env = bundle.vllm.env()
        if role == "prefill":
            assert bundle.vllm.mooncake_bootstrap_port == 8998
            assert launched_env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == "8998"
            assert "kv-bootstrap" in port_names and "kv-bootstrap" in service_ports
        else:
            assert bundle.vllm.mooncake_bootstrap_port is None and "VLLM_MOONCAKE_BOOTSTRAP_PORT" not in launched_env
            assert "kv-bootstrap" not in port_names | service_ports
            assert "8998" not in json.dumps(objects[("Deployment", name)])


def _load_failure_policies(desired: Desired) -> dict[str, set[str]]:
    """Each KV-carrying bundle's kv_load_failure_policy values: the top-level config (the one vLLM's scheduler
    reads) and every MultiConnector child (inert in vLLM, kept equal so the JSON reads as one policy)."""
    found: dict[str, set[str]] = {}
    for name, b in bundles(desired).items():
        if b.kv_transfer is not None:
            configs = [b.kv_transfer, *connectors_of(b.kv_transfer)]
            found[name] = {k.kv_load_failure_policy for k in configs}
    return found


@pytest.mark.parametrize("connector", ["mooncake", "mooncake-store", "mooncake+store", "shared-storage"])
@pytest.mark.parametrize("policy", [None, "recompute", "fail"])
def test_the_kv_load_failure_policy_reaches_every_kv_config(connector: str, policy: str | None) -> None:
    spec = example(OFFLOAD)
    spec["prefill"]["kv"]["connector"] = connector
    spec["sharedStorage"] = {"pvc": {"claimName": "shared"}}
    if "store" not in connector:
        spec["decode"]["kv"] = {}
    if policy is not None:
        spec["decode"]["kv"]["loadFailurePolicy"] = policy
    desired = render(spec)
    expected = policy or "recompute"
    decode = bundles(desired)["demo-decode"].kv_transfer
    assert decode is not None and decode.kv_role == "kv_consumer"
    assert decode.kv_load_failure_policy == expected
    assert _load_failure_policies(desired) == {
        "demo-prefill": {expected},
        "demo-prefill-tp2": {expected},
        "demo-decode": {expected},
    }
    assert check_deployment(bundles(desired)) == []


@pytest.mark.parametrize("policy", [None, "fail"])
def test_a_pd_offloading_to_the_store_loads_with_the_policy(policy: str | None) -> None:
    spec = example(CROSS)
    if policy is not None:
        spec["decode"]["kv"]["loadFailurePolicy"] = policy
    assert _load_failure_policies(render(spec)) == {"demo-pd": {policy or "recompute"}}


def test_the_default_policy_is_in_the_configmap_text_vllm_gets() -> None:
    desired = render(example(OFFLOAD))
    data = by_key(desired)[("ConfigMap", "demo-decode-bundle")]["data"][c.BUNDLE_FILE]
    assert '"kv_load_failure_policy": "fail"' not in data
    assert data.count('"kv_load_failure_policy": "recompute"') == 3  # the MultiConnector and its two children


def test_embedded_store_has_no_clients_and_an_embedded_pool() -> None:
    spec = example(CROSS)
    spec["store"]["mode"] = "embedded"
    desired = render(spec)
    assert not [o for o in desired.objects if o["metadata"]["labels"][c.LABEL_ROLE] == Role.STORE_CLIENT]
    encoder = bundles(desired)["demo-encoder"].mooncake
    assert encoder is not None and encoder.mode.value == "embedded" and encoder.global_segment_size > 0
    assert check_deployment(bundles(desired)) == []


def test_rendering_is_deterministic() -> None:
    assert render(example(OFFLOAD)) == render(example(OFFLOAD))


def test_serving_knobs_reach_their_roles() -> None:
    spec = example(OFFLOAD)
    spec["model"]["blockSize"] = 32
    spec["prefill"]["maxNumBatchedTokens"] = 16384
    spec["decode"]["enforceEager"] = True
    found = bundles(render(spec))
    servers = {name: b.vllm for name, b in found.items() if b.vllm is not None}
    assert {n: s.block_size for n, s in servers.items()} == {
        "demo-encoder": None,
        "demo-prefill": 32,
        "demo-prefill-tp2": 32,
        "demo-decode": 32,
    }
    assert servers["demo-prefill-tp2"].max_num_batched_tokens == 16384
    assert servers["demo-decode"].enforce_eager is True and servers["demo-prefill"].enforce_eager is None


def _set(spec: dict[str, Any], path: str, value: Any) -> None:
    *head, last = path.split(".")
    for key in head:
        spec = spec.setdefault(key, {})
    spec[last] = value


@pytest.mark.parametrize(
    ("name", "path", "value", "rolled"),
    [
        (CROSS, "store.clients.segmentSize", "40GiB", {"demo-store-client"}),
        (CROSS, "store.tenant.isolation", False, {"demo-master"}),
        (CROSS, "encoder.crossEncoderCache.maxPendingItems", 64, {"demo-encoder"}),
        (CROSS, "proxy.routing.encoderAffinity", False, {"demo-proxy"}),
        (CROSS, "proxy.service.port", 9000, set()),
        (CROSS, "store.tenant.id", "team-a", {"demo-store-client", "demo-encoder", "demo-pd", "demo-master"}),
        (SHARED, "model.revision", "r2", {"demo-encoder", "demo-pd"}),
        (OFFLOAD, "model.revision", "r2", {"demo-encoder", "demo-prefill", "demo-prefill-tp2", "demo-decode"}),
        (OFFLOAD, "decode.kv.saveDecodeCache", False, {"demo-decode"}),
        (OFFLOAD, "decode.kv.loadFailurePolicy", "fail", {"demo-prefill", "demo-prefill-tp2", "demo-decode"}),
        (CROSS, "decode.kv.loadFailurePolicy", "fail", {"demo-pd"}),
        (OFFLOAD, "prefill.env", {"LOG_LEVEL": "debug"}, {"demo-prefill", "demo-prefill-tp2"}),
        (OFFLOAD, "encoder.extraArgs", ["--max-model-len", "4096"], {"demo-encoder"}),
    ],
)
def test_a_change_rolls_exactly_the_roles_whose_pods_it_touches(
    name: str, path: str, value: Any, rolled: set[str]
) -> None:
    spec = example(name)
    if path.startswith("store.tenant."):
        spec["store"]["tenant"].pop("quota", None)  # a quota needs isolation; keep both variants valid
    before = render(copy.deepcopy(spec))
    _set(spec, path, value)
    after = render(spec)
    templates = {w["metadata"]["name"]: w["spec"]["template"] for w in workloads(before)}
    changed_pods = {
        w["metadata"]["name"] for w in workloads(after) if w["spec"]["template"] != templates[w["metadata"]["name"]]
    }
    assert changed_pods == rolled


def test_every_vllm_pod_carries_the_model_revision_and_no_other_pod_does() -> None:
    spec = example(OFFLOAD)
    desired = render(spec)
    labelled = {
        w["metadata"]["name"]: w["spec"]["template"]["metadata"]["labels"].get(c.LABEL_MODEL_REVISION)
        for w in workloads(desired)
    }
    revision = desired.derived.model_revision
    assert labelled == {
        "demo-master": None,
        "demo-store-client": None,
        "demo-encoder": revision,
        "demo-prefill": revision,
        "demo-prefill-tp2": revision,
        "demo-decode": revision,
        "demo-proxy": None,
    }
    assert all(c.LABEL_MODEL_REVISION not in w["spec"]["selector"]["matchLabels"] for w in workloads(desired))
    spec["model"]["source"] = {"hostPath": {"path": "/models/other"}}
    assert render(spec).derived.model_revision != revision


PURE_PACKAGES = [Path(__file__).resolve().parents[3] / "operator/src/epd_operator" / p for p in ("derive", "render")]
FORBIDDEN: tuple[str, ...] = ("kopf", "kubernetes", "aiohttp", "urllib", "socket", "subprocess", "os")
FORBIDDEN += tuple(
    f"epd_operator.{m}"
    for m in (
        "_kube",
        "apply",
        "status",
        "handlers",
        "_runtime",
        "state",
        "reconcile",
        "publish",
        "repairs",
        "main",
        "settings",
    )
)


@pytest.mark.parametrize("module", [f for p in PURE_PACKAGES for f in sorted(p.glob("*.py"))], ids=lambda f: f.stem)
def test_derive_and_render_stay_pure(module: Path) -> None:
    """The layer rule: derive and render import only api, derive and the connector library; no I/O, no client."""
    tree = ast.parse(module.read_text())
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    bad = [m for m in imported if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]
    assert not bad, f"{module.name} imports {bad}"
    assert ast.get_docstring(tree), f"{module.name} needs a docstring saying why it exists"


def test_placement_and_surge_reach_every_workload_that_asks() -> None:
    """nodeSelector on the proxy and the master (beside the roles'), and maxSurge on a model role's rollout."""
    spec = example(OFFLOAD)
    spec["proxy"] = {"nodeSelector": {"pool": "cpu"}}
    spec["store"]["master"] = {"nodeSelector": {"pool": "cpu"}}
    spec["decode"]["maxSurge"] = 1
    found = by_key(render(spec))
    for workload in ("demo-proxy", "demo-master"):
        assert found[("Deployment", workload)]["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert found[("Deployment", "demo-decode")]["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 1,
        "maxUnavailable": 0,
    }
    assert found[("Deployment", "demo-encoder")]["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 0,
        "maxUnavailable": 1,
    }
