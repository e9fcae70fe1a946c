"""Discovery's list-and-watch loop keeps the roster equal to the ready pods, with a stand-in Kubernetes client.

The stand-in (tests.proxy.kube_stand_in) has the client's surface that discovery uses and replays slices and
watch events: no cluster runs in this tier, and scaling events are easier to script than to cause.
"""

from __future__ import annotations

import asyncio

from epd_connectors.config.bundle import ECControl
from epd_connectors.config.roles import Role
from epd_connectors.proxy.app import ProxyApp
from epd_connectors.proxy.discovery import kubernetes_discovery
from epd_connectors.proxy.discovery_slices import RoleWatch
from epd_connectors.proxy.roster import Roster
from tests.proxy.harness import FAST, run
from tests.proxy.kube_stand_in import StandInKubernetes, slice_


def test_scaling_events_change_the_roster_without_a_restart() -> None:
    async def main() -> None:
        kube = StandInKubernetes(
            listed=[slice_("enc-a", "demo-encoder", ("10.0.0.1", True)), slice_("pd-a", "demo-pd", ("10.0.1.1", True))],
            events=[
                ("ADDED", slice_("pd-b", "demo-pd", ("10.0.1.2", True))),
                ("MODIFIED", slice_("pd-a", "demo-pd", ("10.0.1.1", False))),
            ],
        )
        watches = [
            RoleWatch(Role.ENCODER, "demo-encoder", port=8000),
            RoleWatch(Role.PD, "demo-pd", port=8000, ec=ECControl(port=14579)),
        ]
        roster = Roster.build({Role.ENCODER: [], Role.PD: []})
        discovery = kubernetes_discovery("ns", watches, client_loader=lambda: kube)
        app = ProxyApp(roster, FAST, discovery=discovery, probe=False)
        await app.startup()
        try:
            for _ in range(200):
                pd = [i.spec for i in roster.instances(Role.PD)]
                if [s.url for s in pd] == ["http://10.0.1.2:8000"] and roster.instances(Role.ENCODER):
                    break
                await asyncio.sleep(0.01)
        finally:
            kube.done.set()
            await app.shutdown()
        assert [s.ec_addresses for s in pd] == [("tcp://10.0.1.2:14579",)]
        assert [i.url for i in roster.instances(Role.ENCODER)] == ["http://10.0.0.1:8000"]
        assert roster.ready(), "discovered ready endpoints start healthy; the prober confirms them"

    run(main)
