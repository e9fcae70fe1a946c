"""HA masters as a deployment renders them (`MasterConfig(ha=...)` with the deployment's cluster id), through a
real etcd, losing their leader under load: the standby leads, the store client mounts its segment on it, the
requester's round trips succeed again, and what the operator reads names the new leader. Also: deployments that
share one etcd elect apart, by cluster id.

Measured here (Mooncake 0.3.13, etcd 3.6, loopback, the oplog on as a deployment renders it; the figures print
with -s): the standby serves ~9 s after the leader is killed or stopped (SIGTERM alike: an exiting master does
not give its lease back; the 5 s lease runs out, then a 5 s warm-up) and the store client has mounted its segment
on it 0.1-0.4 s later. Of ~575 round trips, the one in flight when the leader died fails with -900 (master
unreachable) and those sent while no master serves wait and succeed; a round trip sent in the moment before the
segment is back may fail at once with -200 (no space; about 13 of them without the oplog, none with it). An
exiting master may answer the round trip in flight at SIGTERM with -704 (object not found) instead. A key stored
before the failover reads back from the new leader (the oplog replicated it; without it, it was gone).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from epd_connectors import store_probe
from epd_connectors.config.master import HAConfig
from epd_connectors.launch import readiness
from epd_operator.store_health import store_events
from epd_operator.store_watch import read_master

from .conftest import health

if TYPE_CHECKING:
    from .conftest import Mooncake, RunningMaster

pytestmark = pytest.mark.store

CLUSTER = "serving.demo"
LOAD_S = 40.0
KILL_AFTER_S = 6.0
FAILOVER_LIMIT_S = 30.0
"""Mooncake's own figures: a 5 s lease and a 5 s warm-up; the rest is room for a loaded machine."""
SETTLED_S = 3.0
"""After the new leader serves, round trips still in flight may finish late; later ones must all succeed."""
MASTER_UNREACHABLE = "-900"
NO_SPACE = "-200"
"""A put the new leader refuses because no segment is mounted on it yet (the store client remounts ~1 s later)."""


def serves(master: RunningMaster) -> bool:
    """The check the masters' readiness probe runs (`python -m epd_connectors.launch.readiness URL`)."""
    return readiness.main([master.config.health_url("127.0.0.1")]) == 0


def leader_and_standby(masters: list[RunningMaster], timeout_s: float = 30.0) -> tuple[RunningMaster, RunningMaster]:
    deadline = time.monotonic() + timeout_s
    while True:
        roles = {(health(m.config) or {}).get("role"): m for m in masters}
        if set(roles) == {"leader", "standby"} and serves(roles["leader"]):
            return roles["leader"], roles["standby"]
        if time.monotonic() > deadline:
            pytest.fail(f"no serving leader and standby after {timeout_s} s: {[health(m.config) for m in masters]}")
        time.sleep(0.1)


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGTERM"], ids=["crash", "pod-deleted"])
def test_the_standby_takes_over_under_load_and_the_clients_follow_it(mooncake: Mooncake, signal_name: str) -> None:
    """SIGKILL is a crash (the lease runs out); SIGTERM is what a deleted pod's master gets first."""
    # The oplog on, as spec.store.master.ha.replicateMetadata renders it by default.
    ha = HAConfig(endpoints=(mooncake.etcd(),), cluster_id=CLUSTER, enable_oplog=True)
    leader, standby = leader_and_standby([mooncake.master(serving=False, ha=ha) for _ in range(2)])
    assert not serves(standby)  # so the master Service routes to the leader only

    client = mooncake.client(leader, cluster_id=CLUSTER)
    config = mooncake.workdir / "requester.json"
    config.write_text(client.config.requester_config(local_buffer_size="16 MiB").model_dump_json())
    before = asyncio.run(read_master(leader.config.health_url("127.0.0.1"), leader.metrics_url, CLUSTER))
    assert before.reachable and before.leader == f"127.0.0.1:{leader.config.rpc_port}"

    load = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("ha_load.py")), str(config), str(LOAD_S)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert load.stdout is not None
    began = json.loads(load.stdout.readline())["started"]
    time.sleep(KILL_AFTER_S)
    killed = time.monotonic()
    leader.process.popen.send_signal(getattr(signal, signal_name))

    deadline = killed + FAILOVER_LIMIT_S
    while not serves(standby):
        assert time.monotonic() < deadline, f"the standby never served: {health(standby.config)}"
        time.sleep(0.1)
    failover_s = time.monotonic() - killed
    segment = client.config.global_segment_size
    while store_probe.master_capacity_bytes(standby.metrics_url) < segment:
        assert time.monotonic() < deadline, "the store client never mounted its segment on the new leader"
        time.sleep(0.1)
    remount_s = time.monotonic() - killed

    after = asyncio.run(read_master(standby.config.health_url("127.0.0.1"), standby.metrics_url, CLUSTER))
    assert after.reachable and after.leader == f"127.0.0.1:{standby.config.rpc_port}"
    assert after.capacity_bytes == segment and after.segments == before.segments
    [event] = store_events(before, after)
    assert event.reason == "StoreLeader" and f"(was {before.leader})" in event.message

    out, _ = load.communicate(timeout=LOAD_S + 60)
    lines = [json.loads(line) for line in out.splitlines()]
    trips = [line for line in lines if "t" in line]
    failed = [t for t in trips if t["error"]]
    recovered_at = KILL_AFTER_S + remount_s + SETTLED_S
    settled = [t for t in trips if t["t"] >= recovered_at]
    signalled_at = killed - began
    died_under = [t for t in failed if MASTER_UNREACHABLE in t["error"] or t["t"] <= signalled_at <= t["t"] + t["s"]]
    no_segment = [t for t in failed if NO_SPACE in t["error"]]
    print(
        f"\nHA failover after {signal_name}: the standby serves {failover_s:.1f} s after the signal, the store "
        f"client's segment is mounted on it at {remount_s:.1f} s; {len(failed)} of {len(trips)} round trips failed: "
        f"{len(died_under)} in flight at the signal or -900, {len(no_segment)} with -200 (sent between the new "
        "leader serving and the segment's remount)"
    )
    assert len(settled) >= 20 and not [t for t in settled if t["error"]], settled[:5]
    # Every failure is explained: the master died under it, or the new leader had no segment yet.
    assert [t for t in failed if t not in died_under + no_segment] == [], failed
    assert len(died_under) <= 2 and all(t["t"] < recovered_at for t in failed), failed
    assert lines[-1] == {"before": "kept"}  # put before the failover, read from the new leader


def test_deployments_sharing_one_etcd_elect_apart(mooncake: Mooncake) -> None:
    etcd = mooncake.etcd()
    team_a = [mooncake.master(serving=False, ha=HAConfig(endpoints=(etcd,), cluster_id="team-a")) for _ in range(2)]
    team_b = mooncake.master(serving=False, ha=HAConfig(endpoints=(etcd,), cluster_id="team-b"))
    leader, _ = leader_and_standby(team_a)
    deadline = time.monotonic() + 30
    while not serves(team_b):
        assert time.monotonic() < deadline, f"team-b's only master never led: {health(team_b.config)}"
        time.sleep(0.1)
    assert (health(team_b.config) or {}).get("leader_address") == f"127.0.0.1:{team_b.config.rpc_port}"
    assert (health(leader.config) or {}).get("leader_address") == f"127.0.0.1:{leader.config.rpc_port}"
