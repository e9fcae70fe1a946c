"""A role with several Services (each prefill pool has its own): discovery watches every one, the role's
roster is their union, and each pool's pods get EC control addresses for that pool's parallel sizes.

In process, against the stand-in client of tests.proxy.kube_stand_in; tests/cluster/test_proxy_discovery.py
checks the same against a real control plane and the operator's objects.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from epd_connectors.config.bundle import ECControl, Endpoint, Peers, PrefillEndpoint, ProxySettings, RoleBundle
from epd_connectors.config.ec_transfer import ECMooncakeConsumer, ec_consumer_control_address
from epd_connectors.config.roles import Role
from epd_connectors.proxy import cli
from epd_connectors.proxy.app import ProxyApp
from epd_connectors.proxy.discovery import kubernetes_discovery, union
from epd_connectors.proxy.discovery_slices import RoleWatch
from epd_connectors.proxy.roster import InstanceSpec, Roster
from epd_connectors.proxy.static import watches_from_peers
from tests.proxy.harness import FAST, run
from tests.proxy.kube_stand_in import StandInKubernetes, slice_

EC_PORT = 14579


def peers(tp: tuple[int, int] | None = None, dp: int = 1, bootstrap: tuple[int, int] | None = None) -> Peers:
    """Two prefill pools, each with its own EC layout (tp sizes) and bootstrap port, as the operator renders."""

    def prefill(i: int, host: str) -> PrefillEndpoint:
        ec = ECControl(port=EC_PORT, tensor_parallel_size=tp[i], data_parallel_size=dp) if tp else None
        return PrefillEndpoint(host=host, port=8000, ec=ec, bootstrap_port=bootstrap[i] if bootstrap else None)

    return Peers(
        encoders=[Endpoint(host="vl-encoder.ns.svc", port=8000)],
        prefill=[prefill(0, "vl-prefill.ns.svc"), prefill(1, "vl-prefill-tp2.ns.svc")],
        decode=[Endpoint(host="vl-decode.ns.svc", port=8000)],
    )


PEERS = peers()
ROLES = (Role.ENCODER, Role.PREFILL, Role.DECODE)


def control_addresses(ip: str, tp: int, dp: int) -> tuple[str, ...]:
    """What the consumer pod itself listens on, by the config library's rule (the one source of truth)."""
    consumer = ECMooncakeConsumer(ec_ip=ip, ec_port=EC_PORT)
    return tuple(ec_consumer_control_address(consumer, tp, d) for d in range(dp))


async def until(what: str, done: Callable[[], bool]) -> None:
    for _ in range(500):
        if done():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


def discover(kube: StandInKubernetes, watches: Sequence[RoleWatch], check: Callable[[Roster], Any]) -> None:
    """Run discovery over the stand-in until `check(roster)` stops raising AssertionError (or time is up). No
    probes: the slices' addresses are made up, and nothing may be sent to them (discovered instances then count
    as healthy)."""

    async def main() -> None:
        roster = Roster.build({role: [] for role in ROLES})
        app = ProxyApp(
            roster, FAST, discovery=kubernetes_discovery("ns", watches, client_loader=lambda: kube), probe=False
        )
        await app.startup()
        try:
            for _ in range(300):
                try:
                    check(roster)
                    return
                except AssertionError:
                    await asyncio.sleep(0.01)
            check(roster)
        finally:
            kube.done.set()
            await app.shutdown()

    run(main)


def urls(roster: Roster, role: Role) -> list[str]:
    return [i.url for i in roster.instances(role)]


def test_every_prefill_pool_reaches_the_roster_with_its_own_ec_addresses() -> None:
    """Two pools of TP 1 and TP 2 with DP 2, where the second replica's control port depends on TP. The second
    pool's events (a pod added) must not drop the first pool's pods, nor the first pool's (a pod unready)
    the second's."""
    watches = watches_from_peers(peers(tp=(1, 2), dp=2, bootstrap=(8998, 8998)))
    assert [(w.role, w.service, w.ec and w.ec.tensor_parallel_size) for w in watches if w.role is Role.PREFILL] == [
        (Role.PREFILL, "vl-prefill", 1),
        (Role.PREFILL, "vl-prefill-tp2", 2),
    ]
    kube = StandInKubernetes(
        listed=[
            slice_("enc", "vl-encoder", ("10.0.0.1", True)),
            slice_("p1", "vl-prefill", ("10.0.1.1", True), ("10.0.1.2", True)),
            slice_("p2", "vl-prefill-tp2", ("10.0.2.1", True)),
            slice_("dec", "vl-decode", ("10.0.3.1", True)),
        ],
        events=[
            ("ADDED", slice_("p2-b", "vl-prefill-tp2", ("10.0.2.2", True))),
            ("MODIFIED", slice_("p1", "vl-prefill", ("10.0.1.1", True), ("10.0.1.2", False))),
        ],
    )
    want = {
        "http://10.0.1.1:8000": control_addresses("10.0.1.1", tp=1, dp=2),
        "http://10.0.2.1:8000": control_addresses("10.0.2.1", tp=2, dp=2),
        "http://10.0.2.2:8000": control_addresses("10.0.2.2", tp=2, dp=2),
    }
    assert want["http://10.0.2.1:8000"] == ("tcp://10.0.2.1:14579", "tcp://10.0.2.1:14581")

    def check(roster: Roster) -> None:
        prefill = {i.url: i.spec for i in roster.instances(Role.PREFILL)}
        assert {url: spec.ec_addresses for url, spec in prefill.items()} == want
        assert {spec.bootstrap_url for spec in prefill.values()} == {
            f"http://{u.removeprefix('http://').split(':')[0]}:8998" for u in want
        }
        assert urls(roster, Role.ENCODER) == ["http://10.0.0.1:8000"]
        assert urls(roster, Role.DECODE) == ["http://10.0.3.1:8000"]
        assert roster.ready()

    discover(kube, watches, check)


def test_a_pool_without_pods_leaves_the_other_pools_in_the_roster() -> None:
    watches = watches_from_peers(PEERS)
    kube = StandInKubernetes(
        listed=[
            slice_("enc", "vl-encoder", ("10.0.0.1", True)),
            slice_("p1", "vl-prefill", ("10.0.1.1", True)),
            slice_("p2", "vl-prefill-tp2", ("10.0.2.1", True)),
            slice_("dec", "vl-decode", ("10.0.3.1", True)),
        ],
        events=[("DELETED", slice_("p2", "vl-prefill-tp2"))],
    )

    def check(roster: Roster) -> None:
        assert urls(roster, Role.PREFILL) == ["http://10.0.1.1:8000"]
        assert kube.lists == {s: 1 for s in ("vl-encoder", "vl-prefill", "vl-prefill-tp2", "vl-decode")}

    discover(kube, watches, check)


def test_union_sorts_and_keeps_a_pod_in_two_services_once_as_the_first_gives_it() -> None:
    a = [InstanceSpec("http://10.0.0.2:8000", ("tcp://10.0.0.2:1",)), InstanceSpec("http://10.0.0.9:8000")]
    b = [InstanceSpec("http://10.0.0.2:8000", ("tcp://10.0.0.2:2",)), InstanceSpec("http://10.0.0.1:8000")]
    assert union([a, b]) == [b[1], a[0], a[1]]
    assert union([]) == []


def test_each_service_gets_its_own_endpoints_settings_and_no_other_role_any() -> None:
    watches = watches_from_peers(peers(tp=(4, 2), bootstrap=(8998, 8999)))
    prefill = [w for w in watches if w.role is Role.PREFILL]
    assert [(w.ec, w.bootstrap_port) for w in prefill] == [
        (ECControl(port=EC_PORT, tensor_parallel_size=4), 8998),
        (ECControl(port=EC_PORT, tensor_parallel_size=2), 8999),
    ]
    others = [w for w in watches if w.role is not Role.PREFILL]
    assert all(w.ec is None and w.bootstrap_port is None for w in others)


def test_the_command_takes_per_service_sizes_from_the_bundle(tmp_path: Path) -> None:
    """As the operator renders them (each prefill endpoint's ec); a bundle whose endpoints disagree is one
    line."""
    path = tmp_path / "bundle.json"
    settings = ProxySettings(discover=True)
    bundle = RoleBundle(deployment="vl", namespace="ns", role=Role.PROXY, proxy=settings, peers=peers(tp=(1, 2)))
    path.write_text(bundle.to_json())
    watches = watches_from_peers(bundle.peers)
    assert [w.ec.tensor_parallel_size for w in watches if w.role is Role.PREFILL and w.ec] == [1, 2]
    app, *_ = cli.build(["--bundle", str(path)], {})
    assert app.roster.roles == frozenset(ROLES)
    assert not any(app.roster.instances(role) for role in ROLES), "members come from the EndpointSlices"
    half = bundle.model_dump(mode="json")
    half["peers"]["prefill"][1].pop("ec")
    path.write_text(json.dumps(half))
    with pytest.raises(SystemExit, match=r"peers\.prefill\[\*\]\.ec = 'set on \[0\] only'"):
        cli.build(["--bundle", str(path)], {})
