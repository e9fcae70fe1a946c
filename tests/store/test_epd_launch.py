"""epd-launch against real Mooncake processes: it starts the master and a store owner from generated bundles,
waits for a master that comes up late, and stops with one clear line when none comes. As a container's PID 1
(a new PID namespace, as a pod runs it), it runs an HA master as a child, so the SIGTERM of a pod's deletion
stops it: Mooncake's HA master installs no handler, and as PID 1 the kernel would drop the signal."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from epd_connectors import store_probe
from epd_connectors.config.bundle import RoleBundle
from epd_connectors.config.master import HAConfig, MasterConfig
from epd_connectors.config.mooncake import MooncakeStoreConfig
from epd_connectors.launch import readiness

from .conftest import LOOPBACK, Mooncake, free_port, health

pytestmark = pytest.mark.store

BIN_DIR = Path(sys.executable).parent


def _bundles(tmp_path: Path, *, deadline_s: float = 30.0, tenant: str = "default") -> dict[str, RoleBundle]:
    """A master bundle (multi-tenant, policy admitting `tenant`) and a store-client bundle for it."""
    master = MasterConfig.model_validate(
        {
            "rpc_address": LOOPBACK,
            "rpc_port": free_port(),
            "metrics_port": free_port(),
            "enable_multi_tenants": True,
            "tenant_quota_policy": {"version": 1, "tenants": [{"name": tenant, "quota": 1 << 30}]},
            "tenant_quota_policy_path": str(tmp_path / "policy" / "tenant_quota.yaml"),
        }
    )
    head: dict[str, Any] = {"deployment": "launch-test", "wait": {"deadline_s": deadline_s, "interval_s": 0.2}}
    client = {
        "host": LOOPBACK,
        "port": free_port(),
        "global_segment_size": "128 MiB",
        "master_server_address": master.client_master_address(LOOPBACK),
        "protocol": "tcp",
        "tenant_id": tenant,
    }
    return {
        "master": RoleBundle.model_validate({**head, "role": "master", "master": master.model_dump()}),
        "store-client": RoleBundle.model_validate(
            {
                **head,
                "role": "store-client",
                "store_client": client,
                "peers": {"master_health_url": master.health_url(LOOPBACK)},
            }
        ),
    }


class Launched:
    """An epd-launch subprocess (which becomes the real process after exec)."""

    def __init__(self, role: str, bundle: RoleBundle, workdir: Path, wrapper: tuple[str, ...] = ()) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        path = workdir / f"{role}.json"
        path.write_text(bundle.to_json())
        self.log = workdir / f"{role}.log"
        env = {**os.environ, "PATH": f"{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"}
        env.pop("POD_IP", None)
        with self.log.open("wb") as out:
            self.popen = subprocess.Popen(
                [*wrapper, str(BIN_DIR / "epd-launch"), role, "--bundle", str(path), "--workdir", str(workdir / "run")],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


@pytest.fixture
def launched(tmp_path: Path) -> Any:
    started: list[Launched] = []

    def launch(role: str, bundle: RoleBundle, wrapper: tuple[str, ...] = (), name: str = "") -> Launched:
        process = Launched(role, bundle, tmp_path / (name or role), wrapper)
        started.append(process)
        return process

    yield launch
    for process in reversed(started):
        process.stop()


def _wait_until(check: Any, what: str, process: Launched, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert process.popen.poll() is None, f"{what}: epd-launch exited early:\n{process.output()}"
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s}s:\n{process.output()}"
        time.sleep(0.1)


def _capacity(bundle: RoleBundle) -> int:
    assert bundle.master is not None
    try:
        return store_probe.master_capacity_bytes(bundle.master.metrics_url(LOOPBACK))
    except OSError:
        return 0


def test_master_and_owner_from_bundles_serve_a_requester(tmp_path: Path, launched: Any, mooncake: Mooncake) -> None:
    bundles = _bundles(tmp_path, tenant="team-a")
    master = launched("master", bundles["master"])
    owner = launched("store-client", bundles["store-client"])
    _wait_until(lambda: _capacity(bundles["master"]) >= 128 << 20, "store owner mounted", owner)
    assert master.popen.poll() is None
    assert bundles["store-client"].store_client is not None
    requester = mooncake.requester(bundles["store-client"].store_client.requester_config("32 MiB"))
    assert requester.put("launch-key", b"through the owner") == 0
    assert requester.get("launch-key") == b"through the owner"
    assert "the Mooncake master is ready" in owner.output()


def test_owner_started_before_the_master_waits_then_succeeds(tmp_path: Path, launched: Any) -> None:
    bundles = _bundles(tmp_path)
    owner = launched("store-client", bundles["store-client"])
    # Its start (Python, the bundle) takes a second or several on a slow CPU: wait for the line, not a fixed time.
    _wait_until(lambda: "waiting for the Mooncake master" in owner.output(), "the owner waiting for its master", owner)
    launched("master", bundles["master"])
    _wait_until(lambda: _capacity(bundles["master"]) > 0, "store owner mounted after a late master", owner)


def test_no_master_stops_at_the_deadline_with_one_clear_line(tmp_path: Path, launched: Any) -> None:
    bundles = _bundles(tmp_path, deadline_s=1.0)
    owner = launched("store-client", bundles["store-client"])
    assert owner.popen.wait(timeout=15) == 1
    last = owner.output().strip().splitlines()[-1]
    assert last.startswith("epd-launch[store-client]: gave up after 1s waiting for the Mooncake master at http://")
    assert "Connection refused" in last


def test_store_user_json_from_a_bundle_reaches_the_launched_master(tmp_path: Path, launched: Any) -> None:
    """Embedded mode: a requester contributing its own segment, set up from JSON pointed at the launched master."""
    bundles = _bundles(tmp_path)
    master = launched("master", bundles["master"])
    assert bundles["master"].master is not None
    store_probe.wait_for_master(bundles["master"].master.health_url(LOOPBACK), timeout_s=20)
    config = MooncakeStoreConfig.model_validate(
        {
            "metadata_server": "P2PHANDSHAKE",
            "master_server_address": bundles["master"].master.client_master_address(LOOPBACK),
            "protocol": "tcp",
            "mode": "embedded",
            "global_segment_size": "64 MiB",
            "local_buffer_size": "16 MiB",
        }
    )
    store = store_probe.open_store(config, LOOPBACK)
    try:
        assert store.put("embedded-key", b"x" * 4096) == 0
        assert store.get("embedded-key") == b"x" * 4096
    finally:
        store.close()
    assert master.popen.poll() is None


def as_pid_1() -> tuple[str, ...]:
    """A prefix that runs a command as PID 1 of a new PID namespace, as a container runtime does (root)."""
    unshare = shutil.which("unshare")
    assert unshare is not None, "unshare (util-linux) is needed; make setup-apt installs it"
    return (unshare, "--pid", "--fork", "--kill-child", "--")


def init_of(wrapper_pid: int) -> int:
    """The host PID of the namespace's PID 1: unshare's one child (it appears just after unshare starts)."""
    deadline = time.monotonic() + 10
    while True:
        children = Path(f"/proc/{wrapper_pid}/task/{wrapper_pid}/children").read_text().split()
        if children:
            return int(children[0])
        assert time.monotonic() < deadline, "unshare started no child"
        time.sleep(0.05)


def _ha_master(etcd: str, cluster_id: str) -> MasterConfig:
    return MasterConfig(
        rpc_address=LOOPBACK,
        rpc_port=free_port(),
        metrics_port=free_port(),
        enable_http_metadata_server=False,
        ha=HAConfig(endpoints=(etcd,), cluster_id=cluster_id),
    )


def _role(master: MasterConfig) -> str:
    return str((health(master) or {}).get("role", ""))


def test_an_ha_master_as_pid_1_runs_as_a_child_so_sigterm_stops_it_and_the_standby_leads(
    tmp_path: Path, launched: Any, mooncake: Mooncake
) -> None:
    etcd = mooncake.etcd()
    # What a pod's deletion did before: the master itself as PID 1 ignores SIGTERM and keeps leading until the
    # kubelet's SIGKILL (if Mooncake ever handles SIGTERM in HA mode, this fails and the supervision can go).
    bare = _ha_master(etcd, "bare")
    process = mooncake.spawn("bare-master", [*as_pid_1(), str(BIN_DIR / "mooncake_master"), *bare.argv()[1:]])
    _wait_until_role(bare, "leader", process.popen)
    os.kill(init_of(process.popen.pid), signal.SIGTERM)
    time.sleep(3)
    assert process.alive() and _role(bare) == "leader", (
        "a bare HA master as PID 1 now stops on SIGTERM: Mooncake handles it in HA mode, so LaunchPlan.supervised "
        "is no longer needed"
    )
    process.stop()

    head: dict[str, Any] = {"deployment": "launch-test", "wait": {"deadline_s": 30, "interval_s": 0.2}}
    configs = [_ha_master(etcd, "launched") for _ in range(2)]
    masters = [
        launched(
            "master",
            RoleBundle.model_validate({**head, "role": "master", "master": config.model_dump()}),
            as_pid_1(),
            name=f"master-{i}",
        )
        for i, config in enumerate(configs)
    ]
    _wait_until(lambda: {_role(c) for c in configs} == {"leader", "standby"}, "a leader and a standby", masters[0])
    leader = 0 if _role(configs[0]) == "leader" else 1
    standby = 1 - leader
    assert "as a child (forwarding signals)" in masters[leader].output()
    began = time.monotonic()
    os.kill(init_of(masters[leader].popen.pid), signal.SIGTERM)
    # epd-launch exits as its child did (128 + SIGTERM), and unshare as epd-launch.
    assert masters[leader].popen.wait(timeout=5) == 128 + signal.SIGTERM, masters[leader].output()
    stopped = time.monotonic() - began
    _wait_until(
        lambda: readiness.main([configs[standby].health_url(LOOPBACK)]) == 0,  # the master pods' readiness probe
        "the standby to lead and serve",
        masters[standby],
        timeout_s=30,
    )
    print(
        f"\nHA master as PID 1: stopped {stopped:.1f} s after SIGTERM, standby serving {time.monotonic() - began:.1f} s"
    )


def _wait_until_role(master: MasterConfig, role: str, popen: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while _role(master) != role:
        assert popen.poll() is None, f"the master exited ({popen.returncode})"
        assert time.monotonic() < deadline, f"no {role} after {timeout_s} s: {health(master)}"
        time.sleep(0.1)
