"""The local runner's address plan and profile, without processes: render on a loopback site and read the bundles.

The seam (derive.site) must leave a cluster's rendering untouched, and on the local site every address a role
binds or dials must be 127.0.0.1 with a port of its own, decided while rendering (no placeholders, no DNS names).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from epd_connectors.config.bundle import POD_IP_PLACEHOLDER, parse_bundle
from epd_connectors.config.ec_transfer import ECExampleConnectorConfig, ECMooncakeConsumer, ECMooncakeProducer
from epd_connectors.config.roles import Role
from epd_connectors.launch.plan import plan_launch
from epd_local import plan as local_plan
from epd_local import profile
from epd_operator.api.resource import OperatorDefaults, Owner
from epd_operator.api.spec import EPDDeploymentSpec
from epd_operator.api.store import MasterHASpec
from epd_operator.derive import ports
from epd_operator.derive.site import CLUSTER, LOOPBACK, ClusterNetwork, LocalNetwork
from epd_operator.render import render_desired

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
LOCAL = ROOT / "examples" / "local-e-pd.yaml"
OFFLOAD = ROOT / "examples" / "e-p-d-store-offload.yaml"
CROSS = ROOT / "examples" / "e-pd-mooncake-cross-encoder.yaml"
WORK = Path("/tmp/epd-local-test")
MODEL = Path("/opt/models/tiny")


def _plan(path: Path, chosen: profile.LocalProfile = profile.CPU, base: int = 30000) -> local_plan.LocalPlan:
    return _plan_of(*local_plan.load_manifest(path), chosen, base)


def _plan_of(
    owner: Owner, spec: EPDDeploymentSpec, chosen: profile.LocalProfile = profile.CPU, base: int = 30000
) -> local_plan.LocalPlan:
    paths = local_plan.local_paths(WORK, MODEL)
    return local_plan.plan_local(owner, spec, paths=paths, profile=chosen, base_port=base)


def _by_role(plan: local_plan.LocalPlan) -> dict[Role, list[local_plan.Instance]]:
    out: dict[Role, list[local_plan.Instance]] = {}
    for instance in plan.instances:
        out.setdefault(instance.role, []).append(instance)
    return out


@pytest.mark.parametrize("path", [LOCAL, OFFLOAD, CROSS], ids=lambda p: p.stem)
def test_the_cluster_site_is_the_default_rendering(path: Path) -> None:
    owner, spec = local_plan.load_manifest(path)
    assert render_desired(owner, spec, OperatorDefaults()) == render_desired(owner, spec, OperatorDefaults(), CLUSTER)


def test_cluster_network_is_service_dns_and_fixed_ports() -> None:
    network = ClusterNetwork()
    assert network.host("tiny-vl-pd", "serving") == "tiny-vl-pd.serving.svc"
    assert network.port("tiny-vl-pd", ports.HTTP, 8000) == 8000
    assert network.own_address is None
    assert not network.static_roster


def test_local_network_gives_one_port_per_question_and_the_same_answer_twice() -> None:
    network = LocalNetwork(base_port=40000, taken=frozenset({40001}))
    a = network.port("x-encoder", ports.HTTP, 8000)
    b = network.port("x-pd", ports.HTTP, 8000)
    assert (a, b) == (40000, 40002)  # 40001 is taken
    assert network.port("x-encoder", ports.HTTP, 1) == a
    assert network.host("x-pd", "default") == LOOPBACK


def test_local_network_keeps_room_for_every_tp_rank_of_an_ec_consumer() -> None:
    network = LocalNetwork(base_port=40000)
    ec = network.port("x-pd", ports.ec_port_name(0), 33333)
    after = network.port("x-proxy", ports.HTTP, 8000)
    assert after >= ec + 8


def test_the_local_example_runs_every_role_on_loopback_with_its_own_port() -> None:
    plan = _plan(LOCAL)
    roles = _by_role(plan)
    assert sorted(r.value for r in roles) == ["encoder", "pd", "proxy"]
    every_port = [p for i in plan.instances for p in i.ports.values()]
    assert len(every_port) == len(set(every_port))
    assert all(30000 <= p < 30100 for p in every_port)
    for instance in plan.instances:
        assert ".svc" not in instance.bundle_json
        assert POD_IP_PLACEHOLDER not in instance.bundle_json
    proxy = roles[Role.PROXY][0].bundle
    assert proxy.proxy is not None and proxy.proxy.host == LOOPBACK
    assert plan.endpoint == f"http://{LOOPBACK}:{proxy.proxy.port}"
    for role, peers in ((Role.ENCODER, proxy.peers.encoders), (Role.PD, proxy.peers.pd)):
        server = roles[role][0].bundle.vllm
        assert server is not None
        assert [(e.host, e.port) for e in peers] == [(LOOPBACK, server.port)]
        assert server.host == LOOPBACK
        assert roles[role][0].ready.url == f"http://{LOOPBACK}:{server.port}/health"
    assert not proxy.proxy.discover  # a static roster: nothing to discover on a laptop


def test_the_local_example_uses_the_model_folder_and_a_shared_folder_of_the_work_directory() -> None:
    roles = _by_role(_plan(LOCAL))
    encoder, pd = roles[Role.ENCODER][0].bundle, roles[Role.PD][0].bundle
    assert encoder.vllm is not None and pd.vllm is not None
    assert encoder.vllm.model == pd.vllm.model == str(MODEL)
    assert pd.vllm.block_size == 32
    for bundle in (encoder, pd):
        assert isinstance(bundle.ec_transfer, ECExampleConnectorConfig)
        assert bundle.ec_transfer.ec_connector_extra_config.shared_storage_path == str(WORK / "shared" / "ec")
        assert "VLLM_CPU_KVCACHE_SPACE" not in bundle.env  # it would override --kv-cache-memory-bytes
        assert bundle.env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
        assert bundle.env["OMP_NUM_THREADS"] == "1"
        assert bundle.env["TORCHDYNAMO_DISABLE"] == "1"
        assert bundle.env["HF_HUB_OFFLINE"] == "1"


def test_epd_launch_runs_the_local_bundle_on_the_planned_port() -> None:
    pd = _by_role(_plan(LOCAL))[Role.PD][0]
    launch = plan_launch(pd.bundle, workdir="/tmp/w", bundle_path="/tmp/b.json", environ={"POD_IP": LOOPBACK})
    argv = launch.argv
    assert argv[argv.index("--port") + 1] == str(pd.ports[ports.HTTP])
    assert argv[argv.index("--host") + 1] == LOOPBACK
    assert argv[argv.index("--block-size") + 1] == "32"
    assert "--enforce-eager" in argv
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(64 * 1024**2)


def test_every_vllm_role_of_the_local_plan_runs_lean() -> None:
    roles = _by_role(_plan(OFFLOAD))
    for role in (Role.ENCODER, Role.PREFILL, Role.DECODE):
        for instance in roles[role]:
            launch = plan_launch(instance.bundle, workdir="/w", bundle_path="/b.json", environ={"POD_IP": LOOPBACK})
            assert "--enforce-eager" in launch.argv, role
            assert launch.argv.count("--kv-cache-memory-bytes") == 1, role
            assert "VLLM_CPU_KVCACHE_SPACE" not in launch.env, role


def test_the_store_deployment_points_every_store_user_at_the_local_master() -> None:
    plan = _plan(OFFLOAD)
    roles = _by_role(plan)
    master = roles[Role.MASTER][0]
    client = roles[Role.STORE_CLIENT][0].bundle.store_client
    assert master.bundle.master is not None and client is not None
    rpc, metrics = master.ports[ports.RPC], master.ports[ports.METRICS]
    assert (master.bundle.master.rpc_port, master.bundle.master.metrics_port) == (rpc, metrics)
    assert client.master_server_address == f"{LOOPBACK}:{rpc}"
    assert client.host == LOOPBACK and client.protocol == "tcp"
    assert client.global_segment_size <= 256 * 1024**2
    for instance in roles[Role.PREFILL] + roles[Role.DECODE]:
        mooncake = instance.bundle.mooncake
        assert mooncake is not None
        assert mooncake.master_server_address == f"{LOOPBACK}:{rpc}"
        assert instance.bundle.peers.master_health_url == f"http://{LOOPBACK}:{metrics}/health"
    assert master.ready.url == f"http://{LOOPBACK}:{metrics}/health"
    assert roles[Role.STORE_CLIENT][0].ready.tcp == (LOOPBACK, client.port)


def test_the_proxy_lists_each_ec_consumer_and_bootstrap_port_of_the_local_prefills() -> None:
    roles = _by_role(_plan(OFFLOAD))
    proxy = roles[Role.PROXY][0].bundle
    expected = []
    for prefill in roles[Role.PREFILL]:
        ec = prefill.bundle.ec_transfer
        assert isinstance(ec, ECMooncakeConsumer)
        assert (ec.ec_ip, ec.ec_port) == (LOOPBACK, prefill.ports[ports.ec_port_name(0)])
        expected.append(f"tcp://{LOOPBACK}:{ec.ec_port}")
    assert proxy.peers.ec_addresses() == expected
    assert [e.port for e in proxy.peers.prefill] == [p.ports[ports.HTTP] for p in roles[Role.PREFILL]]


def test_the_cpu_profile_says_what_it_changes_and_keeps_what_the_spec_sets() -> None:
    _, spec = local_plan.load_manifest(OFFLOAD)
    adjusted, changes = profile.apply_profile(spec, profile.CPU)
    assert "spec.model.blockSize: None -> 32" in changes
    assert "spec.store.protocol: 'rdma' -> 'tcp'" in changes
    assert "spec.encoder.replicas: 2 -> 1" in changes
    assert adjusted.encoder.buffer_device == "cpu"
    assert "spec.decode.enforceEager: None -> True" in changes
    assert "spec.prefill.enforceEager: None -> True" in changes
    assert not any(line.startswith("spec.encoder.enforceEager") for line in changes)  # encoders always run eager
    for section in ("encoder", "prefill", "decode"):
        assert f"spec.{section}.extraArgs: + --kv-cache-memory-bytes 67108864" in changes
    assert adjusted.decode.enforce_eager is True and adjusted.prefill is not None
    assert adjusted.prefill.extra_args[-2:] == ["--kv-cache-memory-bytes", str(64 * 1024**2)]
    assert not any("VLLM_CPU_KVCACHE_SPACE" in line for line in changes)
    assert profile.apply_profile(spec, profile.NONE) == (spec, [])


@pytest.mark.parametrize(
    ("extra_args", "env"),
    [
        (["--kv-cache-memory-bytes", "1000000"], {}),
        (["--kv_cache_memory_bytes=1000000"], {}),
        ([], {"VLLM_CPU_KVCACHE_SPACE": "4"}),  # the CPU build's own size, which would override the flag
    ],
)
def test_the_cpu_profile_keeps_a_kv_cache_size_the_spec_gives(extra_args: list[str], env: dict[str, str]) -> None:
    _, spec = local_plan.load_manifest(OFFLOAD)
    decode = spec.decode.model_copy(update={"extra_args": extra_args, "env": env, "enforce_eager": False})
    adjusted, changes = profile.apply_profile(spec.model_copy(update={"decode": decode}), profile.CPU)
    assert adjusted.decode.extra_args == extra_args
    assert {k: v for k, v in adjusted.decode.env.items() if k in env} == env
    assert not any(line.startswith("spec.decode.extraArgs") for line in changes)
    assert "spec.decode.enforceEager: False -> True" in changes


def test_without_the_profile_more_than_one_replica_is_refused_with_the_fix() -> None:
    with pytest.raises(local_plan.LocalPlanError) as caught:
        _plan(OFFLOAD, profile.NONE)
    assert any("replicas = 2" in p and "Fix: set its replicas to 1" in p for p in caught.value.problems)


def _with_ha_masters(path: Path) -> tuple[Owner, EPDDeploymentSpec]:
    owner, spec = local_plan.load_manifest(path)
    assert spec.store is not None
    ha = MasterHASpec(replicas=3, etcd_endpoints=["etcd.serving.svc:2379"])
    store = spec.store.model_copy(update={"master": spec.store.master.model_copy(update={"ha": ha})})
    return owner, EPDDeploymentSpec.model_validate(spec.model_copy(update={"store": store}).model_dump(by_alias=True))


def test_the_profile_runs_ha_masters_as_one_master_and_says_so() -> None:
    plan = _plan_of(*_with_ha_masters(OFFLOAD))
    assert "spec.store.master.ha: 3 masters -> unset (one master)" in plan.profile_changes
    assert len(_by_role(plan)[Role.MASTER]) == 1


def test_without_the_profile_ha_masters_are_refused_naming_the_ha_field() -> None:
    with pytest.raises(local_plan.LocalPlanError) as caught:
        _plan_of(*_with_ha_masters(OFFLOAD), profile.NONE)
    master = [p for p in caught.value.problems if "replicas = 3" in p]
    assert master and all("Fix: remove spec.store.master.ha for a local run" in p for p in master)


def test_a_file_that_is_not_an_epddeployment_is_one_clear_line(tmp_path: Path) -> None:
    bad = tmp_path / "x.yaml"
    bad.write_text("kind: Deployment\n")
    with pytest.raises(local_plan.LocalPlanError, match="not an EPDDeployment manifest"):
        local_plan.load_manifest(bad)


def test_the_cpu_profile_caps_the_ec_buffer_and_render_carries_it_to_both_ends() -> None:
    _, spec = local_plan.load_manifest(ROOT / "examples" / "local-e-p-d.yaml")
    assert spec.encoder.connector == "mooncake" and spec.encoder.buffer_size == 10**9
    adjusted, changes = profile.apply_profile(spec, profile.CPU)
    assert adjusted.encoder.buffer_size == 64 * 1024**2
    assert "spec.encoder.bufferSize: 1000000000 -> 67108864 bytes" in changes
    assert profile.apply_profile(spec, profile.NONE)[0].encoder.buffer_size == 10**9
    sizes = {
        i.role: i.bundle.ec_transfer.ec_buffer_size
        for i in _plan(ROOT / "examples" / "local-e-p-d.yaml").instances
        if isinstance(i.bundle.ec_transfer, ECMooncakeConsumer | ECMooncakeProducer)
    }
    assert sizes == {Role.ENCODER: 64 * 1024**2, Role.PREFILL: 64 * 1024**2}, sizes


def test_each_local_vllm_instance_keeps_its_ipc_sockets_in_a_folder_of_its_own() -> None:
    """MooncakeStoreConnector's lookup socket is <VLLM_RPC_BASE_PATH>/lookup_rpc_port_0_host_<host>_dp_rank0 in
    both vLLM versions: the prefill's and the decode's would be one path on one host without their own base."""
    plan = _plan(ROOT / "examples" / "local-e-p-d.yaml")
    vllm = [i for i in plan.instances if i.bundle.vllm is not None]
    assert sorted(i.role.value for i in vllm) == ["decode", "encoder", "prefill"]
    dirs = [i.rpc_dir for i in vllm]
    assert None not in dirs and len(set(dirs)) == len(dirs)
    assert all(i.rpc_dir is None for i in plan.instances if i.bundle.vllm is None)
    # vLLM's own ipc sockets there are named by a uuid; the lookup socket by the host name (32 here).
    longest = max(len(f"{d}/lookup_rpc_port_0_host_{'h' * 32}_dp_rank0") for d in dirs)
    assert longest <= 107, "a unix socket path holds at most 107 bytes"
    owner, spec = local_plan.load_manifest(ROOT / "examples" / "local-e-p-d.yaml")
    deep_paths = local_plan.local_paths(Path("/tmp/" + "w" * 100), MODEL)
    deep = local_plan.plan_local(owner, spec, paths=deep_paths, profile=profile.CPU, base_port=30000)
    assert [i.rpc_dir for i in deep.instances] == [i.rpc_dir for i in plan.instances], "whatever the workdir"


def test_the_local_store_listens_on_loopback_only() -> None:
    """The master's RPC and metrics/admin servers bind the site's loopback; the store client's RPC port does,
    and its HTTP server (mooncake_client has no flag for that server's address) is off locally."""
    plan = _plan(OFFLOAD)
    roles = _by_role(plan)
    master = roles[Role.MASTER][0].bundle.master
    client = roles[Role.STORE_CLIENT][0]
    assert master is not None and client.bundle.store_client is not None
    argv = master.argv()
    assert f"--rpc_address={LOOPBACK}" in argv and f"--metrics_host={LOOPBACK}" in argv
    client_argv = client.bundle.store_client.argv()
    assert f"--host={LOOPBACK}" in client_argv and "--enable_http_server=false" in client_argv
    owner, spec = local_plan.load_manifest(OFFLOAD)
    assert spec.store is not None
    store = spec.store.model_copy(
        update={"master": spec.store.master.model_copy(update={"http_metadata_server": True})}
    )
    spec = spec.model_copy(update={"store": store})
    paths = local_plan.local_paths(WORK, MODEL)
    with_metadata = local_plan.plan_local(owner, spec, paths=paths, profile=profile.CPU, base_port=30000)
    metadata_master = _by_role(with_metadata)[Role.MASTER][0].bundle.master
    assert metadata_master is not None and f"--http_metadata_server_host={LOOPBACK}" in metadata_master.argv()


def test_a_cluster_store_keeps_mooncakes_all_interfaces_defaults() -> None:
    """In a pod, probes and peers come to the pod's IP: the cluster rendering sets no bind address."""
    owner, spec = local_plan.load_manifest(OFFLOAD)
    desired = render_desired(owner, spec, OperatorDefaults(), CLUSTER)
    bundles = [parse_bundle(o["data"]["bundle.json"]) for o in desired.objects if o["kind"] == "ConfigMap"]
    master = next(b.master for b in bundles if b.master is not None)
    client = next(b.store_client for b in bundles if b.store_client is not None)
    assert "--rpc_address=0.0.0.0" in master.argv() and not any("metrics_host" in a for a in master.argv())
    assert client.enable_http_server
