"""The operator's store watch against a real master: status.store, StoreReady and the Events, written through
the unit tier's in-memory API server (a stand-in: what is under test here is the reading of the master)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from epd_connectors.config.roles import Role
from epd_operator import status, store_watch
from epd_operator.api import constants as c
from epd_operator.api.status import EPDDeploymentStatus
from epd_operator.render import Derived, Desired, RoleWorkload
from epd_operator.state import DeploymentState, owner_of_body
from tests.unit.operator.test_status_runtime import KEY, QUIET, Api, body, runtime

if TYPE_CHECKING:
    from .conftest import Mooncake

pytestmark = pytest.mark.store

MiB = 1024**2
WORKLOADS = [
    RoleWorkload(Role.MASTER, "Deployment", "demo-master", 1),
    RoleWorkload(Role.STORE_CLIENT, "StatefulSet", "demo-store-client", 1),
]


def ready(w: RoleWorkload) -> dict[str, Any]:
    counts = {"readyReplicas": 1, "updatedReplicas": 1, "replicas": 1, "observedGeneration": 1}
    return {"metadata": {"name": w.name, "uid": w.name, "generation": 1}, "spec": {"replicas": 1}, "status": counts}


def test_the_watch_reports_the_store_and_turns_store_ready_with_the_master(mooncake: Mooncake) -> None:
    master = mooncake.master(client_ttl_s=2)
    client = mooncake.client(master, global_segment_size="32 MiB")
    api = Api()
    rt, events = runtime(api, dataclasses.replace(QUIET, store_poll_interval_s=0.2))
    # The master's Service address, as render derives it, is this loopback master here.
    derived = Derived(
        tenant_id="ns-demo",
        python_hash_seed=1,
        endpoint="http://demo-proxy.ns.svc:8000",
        model_revision="rev",
        master_health_url=master.config.health_url("127.0.0.1"),
        master_metrics_url=master.metrics_url,
    )
    # A deployment whose render (the store's two workloads) was applied, both workloads Ready as their watch
    # would report.
    rt.runtime.world.deployments[KEY] = body()
    applied = Desired([], derived, WORKLOADS)
    rt.states[KEY] = DeploymentState(
        owner_of_body(body()),
        EPDDeploymentStatus(),
        EPDDeploymentStatus(),
        rendered_generation=1,
        desired=applied,
        synced_generation=1,
    )
    for w in WORKLOADS:
        rt.runtime.world.remember((w.kind, "ns", w.name), ready(w), watched=True)

    def written() -> EPDDeploymentStatus:
        return status.parse(api.status_writes[-1]) if api.status_writes else EPDDeploymentStatus()

    async def until(what: str, check: Callable[[EPDDeploymentStatus], bool], timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while not check(written()):
            assert time.monotonic() < deadline, f"no status with {what} in {timeout_s} s; last: {written()}"
            await asyncio.sleep(0.1)

    def store_ready(st: EPDDeploymentStatus) -> tuple[str, str]:
        found = next((x for x in st.conditions if x.type == c.COND_STORE_READY), None)
        return (found.status, found.reason) if found else ("", "")

    async def scenario() -> None:
        rt.queue.add(KEY)
        await until("the pool", lambda st: st.store is not None and st.store.capacity_bytes == 32 * MiB)
        assert store_ready(written()) == ("True", status.REASON_READY)
        client.process.stop()  # the segment goes once its heartbeats lapse (client_ttl_s)
        await until("no capacity", lambda st: store_ready(st) == ("False", status.REASON_NO_CAPACITY))
        master.process.stop()
        await until("the master gone", lambda st: store_ready(st) == ("False", status.REASON_MASTER_UNREACHABLE))
        gone = written().store
        assert gone is not None and not gone.reachable and "127.0.0.1" in gone.message
        rt.deployment_seen("DELETED", body())
        await rt.queue.idle()
        assert not rt.runtime.polls.running(KEY, store_watch.POLL)

    asyncio.run(scenario())
    assert ("warn", "StoreClientUnmounted") in events
    assert ("warn", status.REASON_NO_CAPACITY) in events  # StoreReady's flip, announced
