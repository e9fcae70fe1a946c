"""spec.store.master.ha through render and epd-launch's plan: N masters electing under the deployment's own
key, each advertising its pod IP, only the serving leader Ready; every store user following that election; and
the role counted ready on the one leader."""

from __future__ import annotations

from typing import Any

import pytest

from epd_connectors.config.mooncake import CLUSTER_ID_ENV, RPC_CONNECT_TIMEOUT_ENV
from epd_connectors.config.roles import Role
from epd_connectors.launch.plan import plan_launch
from epd_operator.api.resource import InvalidSpecError
from epd_operator.render import Desired
from epd_operator.status import observe
from tests.unit.operator.test_render import OFFLOAD, bundles, by_key, example, render

pytestmark = pytest.mark.unit

ETCD = ["etcd-0.etcd:2379", "etcd-1.etcd:2379"]


def with_ha(replicas: int = 3) -> Desired:
    spec = example(OFFLOAD)
    spec["store"]["master"] = {"ha": {"replicas": replicas, "etcdEndpoints": ETCD}}
    return render(spec)


def flags(argv: list[str]) -> dict[str, str]:
    return dict(arg.removeprefix("--").split("=", 1) for arg in argv[1:])


def test_the_masters_elect_under_the_deployments_tenant_id_and_advertise_their_pod_ip() -> None:
    desired = with_ha()
    master = bundles(desired)["demo-master"]
    plan = plan_launch(master, workdir="/work", bundle_path="/etc/epd/bundle.json", environ={"POD_IP": "10.1.2.3"})
    argv = flags(plan.argv)
    assert (argv["enable_ha"], argv["ha_backend_type"]) == ("true", "etcd")
    assert argv["ha_backend_connstring"] == ";".join(ETCD)
    assert argv["cluster_id"] == desired.derived.tenant_id == "serving.demo"
    assert argv["rpc_address"] == "10.1.2.3"
    assert argv["enable_http_metadata_server"] == "false"


def test_the_leader_replicates_metadata_to_the_standbys_unless_told_not_to() -> None:
    """Mooncake's oplog (through the same etcd): a failover keeps the objects (tests/store measures it)."""
    master = bundles(with_ha())["demo-master"].master
    assert master is not None and master.ha is not None and master.ha.enable_oplog and master.snapshot is None
    spec = example(OFFLOAD)
    spec["store"]["master"] = {"ha": {"etcdEndpoints": ETCD, "replicateMetadata": False}}
    master = bundles(render(spec))["demo-master"].master
    assert master is not None and master.ha is not None and not master.ha.enable_oplog


def test_a_single_master_snapshots_to_its_work_volume_and_restores_there() -> None:
    """The work folder is the pod's emptyDir, which a restarted container keeps."""
    bundle = bundles(render(example(OFFLOAD)))["demo-master"]
    plan = plan_launch(bundle, workdir="/work", bundle_path="/b.json", environ={"POD_IP": "10.1.2.4"})
    argv = flags(plan.argv)
    assert (argv["enable_snapshot"], argv["enable_snapshot_restore"], argv["snapshot_interval_seconds"]) == (
        "true",
        "true",
        "30",
    )
    assert plan.env["MOONCAKE_SNAPSHOT_LOCAL_PATH"] == "/var/run/epd/master-snapshots"
    spec = example(OFFLOAD)
    spec["store"]["master"] = {"snapshotIntervalSeconds": 0}
    assert bundles(render(spec))["demo-master"].master.snapshot is None  # type: ignore[union-attr]


def test_snapshots_are_refused_for_ha_masters_with_the_field_and_the_fix() -> None:
    spec = example(OFFLOAD)
    spec["store"]["master"] = {"ha": {"etcdEndpoints": ETCD}, "snapshotIntervalSeconds": 60}
    with pytest.raises(InvalidSpecError, match=r"spec\.store\.master\.snapshotIntervalSeconds = 60: HA masters keep"):
        render(spec)


def test_without_its_pod_ip_an_ha_master_refuses_to_start() -> None:
    master = bundles(with_ha())["demo-master"]
    with pytest.raises(ValueError, match=r"master\.rpc_address = 'pod-ip\.invalid'.*Fix: set POD_IP"):
        plan_launch(master, workdir="/work", bundle_path="/b.json", environ={})


def test_every_store_user_follows_the_same_election() -> None:
    rendered = bundles(with_ha())
    client = rendered["demo-store-client"].store_client
    assert client is not None
    assert client.master_server_address == "etcd://" + ";".join(ETCD)
    assert client.env()[CLUSTER_ID_ENV] == "serving.demo"
    users = [b for b in rendered.values() if b.mooncake is not None]
    assert {b.role for b in users} == {Role.PREFILL, Role.DECODE}  # KV through the store; EC goes P2P
    for bundle in users:
        plan = plan_launch(bundle, workdir="/work", bundle_path="/b.json", environ={"POD_IP": "10.1.2.4"})
        assert plan.env[CLUSTER_ID_ENV] == "serving.demo", bundle.role
        assert '"master_server_address": "etcd://etcd-0.etcd:2379;etcd-1.etcd:2379"' in next(iter(plan.files.values()))


def test_every_store_user_gives_up_on_a_vanished_leaders_address_within_seconds() -> None:
    rendered = bundles(with_ha())
    users = [b for b in rendered.values() if b.mooncake is not None or b.store_client is not None]
    assert {b.role for b in users} == {Role.PREFILL, Role.DECODE, Role.STORE_CLIENT}
    for bundle in users:
        plan = plan_launch(bundle, workdir="/work", bundle_path="/b.json", environ={"POD_IP": "10.1.2.4"})
        assert plan.env[RPC_CONNECT_TIMEOUT_ENV] == "2000", bundle.role


def test_a_connect_bound_the_spec_or_the_pod_gives_wins() -> None:
    spec = example(OFFLOAD)
    spec["store"]["master"] = {"ha": {"replicas": 2, "etcdEndpoints": ETCD}}
    spec["decode"]["env"] = {RPC_CONNECT_TIMEOUT_ENV: "5000"}
    rendered = bundles(render(spec))
    decode = plan_launch(
        rendered["demo-decode"], workdir="/work", bundle_path="/b.json", environ={"POD_IP": "10.1.2.4"}
    )
    assert decode.env[RPC_CONNECT_TIMEOUT_ENV] == "5000"
    pod_env = {"POD_IP": "10.1.2.4", RPC_CONNECT_TIMEOUT_ENV: "7000"}  # laid under the launcher's env
    prefill = plan_launch(rendered["demo-prefill"], workdir="/work", bundle_path="/b.json", environ=pod_env)
    assert RPC_CONNECT_TIMEOUT_ENV not in prefill.env


def test_one_master_has_no_election_anywhere() -> None:
    rendered = bundles(render(example(OFFLOAD)))
    master = rendered["demo-master"].master
    assert master is not None and master.ha is None and "--cluster_id" not in " ".join(master.argv())
    for bundle in rendered.values():
        plan = plan_launch(bundle, workdir="/work", bundle_path="/b.json", environ={"POD_IP": "10.1.2.4"})
        assert CLUSTER_ID_ENV not in plan.env and RPC_CONNECT_TIMEOUT_ENV not in plan.env


def _master_workload(desired: Desired) -> dict[str, Any]:
    return by_key(desired)[("Deployment", "demo-master")]


def test_n_masters_are_replaced_together_and_only_the_serving_leader_is_ready() -> None:
    deployment = _master_workload(with_ha(3))
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    command = container["readinessProbe"]["exec"]["command"]
    assert command == ["python", "-m", "epd_connectors.launch.readiness", "http://127.0.0.1:9003/health"]
    # Liveness and startup stay on /health, which a standby answers too: a standby is alive, not broken.
    assert container["livenessProbe"]["httpGet"]["path"] == container["startupProbe"]["httpGet"]["path"] == "/health"
    single = _master_workload(render(example(OFFLOAD)))
    assert single["spec"]["replicas"] == 1
    assert single["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/health"


def test_the_master_role_is_ready_on_its_one_leader() -> None:
    desired = with_ha(3)
    [workload] = [w for w in desired.workloads if w.role == Role.MASTER]
    assert workload.ready_needed == 1

    def live(ready: int) -> dict[str, Any]:
        status = {"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3, "readyReplicas": ready}
        return {"metadata": {"generation": 1}, "spec": {"replicas": 3}, "status": status}

    assert observe(workload, live(1)).state == (
        True,
        "AllReplicasReady",
        "Deployment demo-master: 1/3 ready (only the leader is Ready; standbys wait)",
    )
    assert observe(workload, live(0)).state[:2] == (False, "PodsNotReady")
    [single] = [w for w in render(example(OFFLOAD)).workloads if w.role == Role.MASTER]
    assert single.ready_needed is None
