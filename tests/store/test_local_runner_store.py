"""The local runner's store roles for real (no vLLM): examples/e-p-d-store-offload.yaml's master and store client
run through epd-launch from the bundles rendered on the loopback site, and a requester set up from the
Mooncake JSON the same rendering gives the prefill instances puts and gets through them. Then a master restart
as a cluster does it (killed, started again with the same argv by `LocalDeployment.restart`): the store client
mounts its segment again by itself, every key is gone, and the same requester stores again."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from epd_connectors import store_probe
from epd_connectors.config.roles import Role
from epd_local import processes, profile
from epd_local.plan import POD_IP
from tests.sockets import group_pids, tcp_listeners

pytestmark = pytest.mark.store

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE = EXAMPLES / "e-p-d-store-offload.yaml"
OUTAGE_S = 3.0
"""How long the master stays down (the store client's open RPC connection fails at once; its pings, about every
5 s, start reconnecting after 3 failures)."""
RECOVER_S = 60.0
"""How long the store client and a requester may take to find a restarted master (measured: about 1 s for the
client's remount, the requester's next call succeeds)."""


def test_the_runner_starts_the_store_roles_and_the_store_answers(tmp_path: Path) -> None:
    plan = processes.plan_on_free_ports(EXAMPLE, tmp_path, tmp_path / "no-model", profile.CPU)
    prefill = next(i for i in plan.instances if i.role is Role.PREFILL)
    master = next(i for i in plan.instances if i.role is Role.MASTER)
    assert prefill.bundle.mooncake is not None and master.bundle.master is not None
    lines: list[str] = []
    only = {"master", "store-client"}
    with processes.deployment(plan, tmp_path, Path(sys.executable), say=lines.append, only=only) as local:
        assert sorted(r.instance.role.value for r in local.running) == ["master", "store-client"]
        store_probe.wait_for_capacity(master.bundle.master.metrics_url(POD_IP), at_least=1, timeout_s=20)
        store = store_probe.open_store(prefill.bundle.mooncake, POD_IP)
        try:
            result = store_probe.probe(store, "epd-local-runner-probe", b"x" * 4096)
        finally:
            store.close()
        assert result.size == 4096
        assert_store_listens_on_loopback(local)
    assert any(line.startswith("ready   ") and "store-client" in line for line in lines)
    assert any(line.startswith("stopped 2 processes") for line in lines)


TRANSFER_ENGINE_LISTENERS = 2
"""The store client's transfer engine listens on every interface for its handshake and its TCP data port,
whatever --host says (Mooncake 0.3.13 has no flag or variable for either; shared/docs/facts.md)."""
OFFLOAD_RPC_LISTENERS = 1
"""With offload, also its disk-tier RPC server (--start_offload_rpc_server, which requesters read offloaded
objects through; no address flag either), on an ephemeral port."""


def assert_store_listens_on_loopback(local: processes.LocalDeployment) -> None:
    """The master listens on loopback only; the store client too, except the ports Mooncake binds on every
    interface with no flag to change it (its transfer engine's, its offload RPC's), which no plan names."""
    for run in local.running:
        listeners = tcp_listeners(group_pids(run.popen.pid))
        planned = set(run.instance.ports.values())
        assert listeners, f"{run.name}: no listening socket found"
        wide = [lst for lst in listeners if lst.address != POD_IP]
        assert all(lst.port not in planned for lst in wide), f"{run.name}: a planned port off loopback: {wide}"
        assert all(lst.all_interfaces for lst in wide), f"{run.name}: {wide}"
        client = run.instance.bundle.store_client
        limit = 0 if client is None else TRANSFER_ENGINE_LISTENERS + OFFLOAD_RPC_LISTENERS * client.enable_offload
        assert len(wide) <= limit, f"{run.name} listens on every interface: {wide}"
        assert any(lst.address == POD_IP and lst.port in planned for lst in listeners), run.name


def test_after_a_master_restart_the_client_remounts_and_the_store_serves_again_without_its_old_keys(
    tmp_path: Path,
) -> None:
    plan = processes.plan_on_free_ports(EXAMPLES / "local-e-p-d.yaml", tmp_path, tmp_path / "no-model", profile.CPU)
    prefill = next(i for i in plan.instances if i.role is Role.PREFILL)
    master = next(i for i in plan.instances if i.role is Role.MASTER)
    client = next(i for i in plan.instances if i.role is Role.STORE_CLIENT)
    assert prefill.bundle.mooncake is not None and master.bundle.master is not None
    assert client.bundle.store_client is not None
    metrics = master.bundle.master.metrics_url(POD_IP)
    segment = client.bundle.store_client.global_segment_size
    only = {"master", "store-client"}
    with processes.deployment(plan, tmp_path, Path(sys.executable), say=lambda line: None, only=only) as local:
        store_probe.wait_for_capacity(metrics, at_least=segment, timeout_s=20)
        store = store_probe.open_store(prefill.bundle.mooncake, POD_IP)
        try:
            store_probe.probe(store, "before-restart", b"b" * 4096)
            first = local.get(master.name).popen.pid
            local.kill(master.name)
            assert store.put("while-down", b"d" * 4096) != 0, "a put succeeded with the master down"
            time.sleep(OUTAGE_S)
            restarted = local.restart(master.name, deadline_s=30)
            assert restarted.popen.pid != first and local.get(client.name).alive()
            began = time.monotonic()
            assert store_probe.wait_for_capacity(metrics, at_least=segment, timeout_s=RECOVER_S) == segment
            while True:
                try:
                    store_probe.probe(store, "after-restart", b"a" * 4096)
                    break
                except store_probe.StoreError:
                    assert time.monotonic() - began < RECOVER_S, "the requester never stored again"
                    time.sleep(0.5)
            assert not store.get("before-restart"), "a key survived the master restart"
        finally:
            store.close()
        # The restarted master starts empty, so its capacity can only come from the client mounting again; the
        # client's own "Reconnected to master" is an INFO line glog may still hold in its buffer.
        log = local.get(client.name).log.read_text(errors="replace")
        assert "RPC call failed" in log, "the store client never noticed the master was gone"
