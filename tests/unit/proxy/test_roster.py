"""Roster membership, health eviction/re-admission, and the static roster from a bundle or flags
(epd_connectors.proxy.roster, health.apply_probe, static)."""

from __future__ import annotations

import pytest

from epd_connectors.config.bundle import ConsumerEndpoint, ECControl, Endpoint, Peers
from epd_connectors.config.roles import Role
from epd_connectors.proxy.health import Probe, apply_probe
from epd_connectors.proxy.roster import InstanceSpec, Outstanding, Roster
from epd_connectors.proxy.settings import Limits
from epd_connectors.proxy.static import StaticRoster, from_peers, watches_from_peers

pytestmark = pytest.mark.unit


def test_replacing_members_keeps_the_state_of_those_that_stay() -> None:
    roster = Roster.build({Role.PD: [InstanceSpec("http://a"), InstanceSpec("http://b")]}, healthy=True)
    a = roster.get(Role.PD, "http://a")
    assert a is not None
    a.outstanding = 5
    version = roster.version
    roster.replace(Role.PD, [InstanceSpec("http://a"), InstanceSpec("http://c")])
    assert roster.get(Role.PD, "http://a") is a and a.outstanding == 5 and a.healthy
    c = roster.get(Role.PD, "http://c")
    assert c is not None and not c.healthy
    assert roster.get(Role.PD, "http://b") is None
    assert roster.version > version
    version = roster.version
    roster.replace(Role.PD, [InstanceSpec("http://a"), InstanceSpec("http://c")])
    assert roster.version == version


def test_ready_only_when_every_role_has_a_healthy_instance() -> None:
    roster = Roster.build({Role.ENCODER: [InstanceSpec("http://e")], Role.PD: [InstanceSpec("http://p")]})
    assert not roster.ready()
    for instance in roster.instances():
        instance.healthy = True
    assert roster.ready()
    roster.replace(Role.ENCODER, [])
    assert roster.healthy_roles() == {Role.ENCODER: False, Role.PD: True}


def test_outstanding_counts_while_a_request_runs() -> None:
    roster = Roster.build({Role.PD: [InstanceSpec("http://p")]})
    instance = roster.instances()[0]
    with Outstanding(instance):
        assert roster.candidates(Role.PD)[0].outstanding == 1
    assert instance.outstanding == 0


def test_probe_evicts_after_repeated_failures_and_readmits() -> None:
    roster = Roster.build({Role.PD: [InstanceSpec("http://p")]}, healthy=True)
    instance = roster.instances()[0]
    limits = Limits(evict_after=2, readmit_after=2)
    instance.engine_id = "E0"
    assert not apply_probe(instance, Probe.FAILED, limits, 0.0) and instance.healthy
    assert instance.engine_id is None, "a restarted prefill is a new engine: its id is asked again"
    assert apply_probe(instance, Probe.FAILED, limits, 2.0) and not instance.healthy
    assert not apply_probe(instance, Probe.ANSWERED, limits, 4.0) and not instance.healthy
    assert apply_probe(instance, Probe.ANSWERED, limits, 6.0) and instance.healthy


def test_unanswered_probes_evict_only_after_the_grace() -> None:
    """A busy engine whose /health stalls stays in routing for the grace; one that keeps silent past it leaves,
    and an answer in between starts the count again."""
    roster = Roster.build({Role.PD: [InstanceSpec("http://p")]}, healthy=True)
    instance = roster.instances()[0]
    limits = Limits(evict_after=2, slow_probe_grace_s=10.0)
    for now in (0.0, 2.0, 4.0, 9.9):
        assert not apply_probe(instance, Probe.UNANSWERED, limits, now) and instance.healthy, now
    assert not apply_probe(instance, Probe.ANSWERED, limits, 12.0) and instance.failing_since is None
    for now in (13.0, 15.0, 22.9):
        assert not apply_probe(instance, Probe.UNANSWERED, limits, now) and instance.healthy, now
    assert apply_probe(instance, Probe.UNANSWERED, limits, 23.0) and not instance.healthy
    again = Roster.build({Role.PD: [InstanceSpec("http://q")]}, healthy=True).instances()[0]
    apply_probe(again, Probe.UNANSWERED, limits, 0.0)
    assert apply_probe(again, Probe.FAILED, limits, 1.0) and not again.healthy, "a refusal is not forgiven"


def test_static_roster_pd_and_split() -> None:
    pd = StaticRoster(encoders=["http://e:1/"], pd=["http://p:2"], ec_consumers=["tcp://p:14579"]).specs()
    assert pd == {
        Role.ENCODER: [InstanceSpec("http://e:1")],
        Role.PD: [InstanceSpec("http://p:2", ("tcp://p:14579",))],
    }
    split = StaticRoster(prefill=["http://p0:1", "http://p1:1"], decode=["http://d:3"], bootstrap_ports=[8998, 8999])
    specs = split.specs()
    assert [s.bootstrap_url for s in specs[Role.PREFILL]] == ["http://p0:8998", "http://p1:8999"]
    assert specs[Role.DECODE] == [InstanceSpec("http://d:3")]
    assert StaticRoster(decode=["http://d:3"]).specs() == {Role.PD: [InstanceSpec("http://d:3")]}


@pytest.mark.parametrize(
    ("roster", "needle"),
    [
        (StaticRoster(), "no decode or pd"),
        (StaticRoster(prefill=["http://p:1"]), "need decode"),
        (StaticRoster(pd=["ftp://p"]), "not an http"),
        (StaticRoster(pd=["http://a:1", "http://b:1"], ec_consumers=["tcp://a:1"]), "do not divide"),
    ],
)
def test_static_roster_mistakes(roster: StaticRoster, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        roster.specs()


def test_bundle_peers_give_the_roster_and_the_services_to_watch() -> None:
    peers = Peers(
        encoders=[Endpoint(host="demo-encoder.ns.svc", port=8000)],
        pd=[ConsumerEndpoint(host="demo-pd.ns.svc", port=8000, ec=ECControl(port=14579))],
    )
    specs = from_peers(peers).specs()
    assert specs[Role.PD] == [InstanceSpec("http://demo-pd.ns.svc:8000", ("tcp://demo-pd.ns.svc:14579",))]
    watches = watches_from_peers(peers)
    assert [(w.role, w.service, w.port, w.ec) for w in watches] == [
        (Role.ENCODER, "demo-encoder", 8000, None),
        (Role.PD, "demo-pd", 8000, ECControl(port=14579)),
    ]


def test_a_static_roster_from_the_bundle_gives_each_consumer_its_own_replicas_addresses() -> None:
    """By each endpoint's own DP size, not by an even split of one list (1 + 3 addresses would split 2 + 2)."""
    peers = Peers(
        pd=[
            ConsumerEndpoint(host="10.0.0.1", port=8000, ec=ECControl(port=14579)),
            ConsumerEndpoint(host="10.0.0.2", port=8000, ec=ECControl(port=14579, data_parallel_size=3)),
        ]
    )
    specs = from_peers(peers).specs()
    assert [s.ec_addresses for s in specs[Role.PD]] == [
        ("tcp://10.0.0.1:14579",),
        ("tcp://10.0.0.2:14579", "tcp://10.0.0.2:14580", "tcp://10.0.0.2:14581"),
    ]
