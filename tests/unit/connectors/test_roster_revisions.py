"""The roster's revision choice: the newest revision with a healthy instance of every role, and which instances a
request of one revision must avoid. The roster indexes instances by revision once per membership change, so
these tests change health, membership and revisions between calls and hold the answers to a direct reading of
the rule over the whole roster."""

from __future__ import annotations

import random

import pytest

from epd_connectors.config.roles import Role
from epd_connectors.proxy.roster import Instance, InstanceSpec, PodRevision, Roster

pytestmark = pytest.mark.unit

ROLES = (Role.ENCODER, Role.PREFILL, Role.DECODE)
OLD = PodRevision("rev-old", "2026-12-03T07:00:00Z")
NEW = PodRevision("rev-new", "2026-12-03T08:00:00Z")


def roster_of(names: dict[Role, list[str]]) -> Roster:
    return Roster.build(
        {role: [InstanceSpec(f"http://{name}:8000", name=name) for name in names.get(role, [])] for role in ROLES},
        healthy=True,
    )


def instance(roster: Roster, name: str) -> Instance:
    return next(i for i in roster.instances() if i.spec.name == name)


def two_sets() -> Roster:
    roster = roster_of({role: [f"{role.value}-old", f"{role.value}-new"] for role in ROLES})
    roster.set_revisions(
        {f"{role.value}-{age}": OLD if age == "old" else NEW for role in ROLES for age in ("old", "new")}
    )
    return roster


def test_the_newest_whole_set_takes_the_requests_and_a_health_flip_moves_them_back() -> None:
    roster = two_sets()
    assert roster.routing_revision() == "rev-new"
    instance(roster, "decode-new").healthy = False  # the prober's flip: no membership change
    assert roster.routing_revision() == "rev-old"
    instance(roster, "decode-old").healthy = False
    assert roster.routing_revision() is None
    instance(roster, "decode-new").healthy = True
    assert roster.routing_revision() == "rev-new"


def test_a_request_avoids_the_other_revision_and_instances_of_no_known_revision() -> None:
    roster = two_sets()
    roster.replace(
        Role.DECODE, [*(i.spec for i in roster.instances(Role.DECODE)), InstanceSpec("http://x:1", name="x")]
    )
    assert roster.of_other_revisions(Role.DECODE, "rev-new") == {"http://decode-old:8000", "http://x:1"}
    assert roster.of_other_revisions(Role.DECODE, "") == {"http://decode-old:8000", "http://decode-new:8000"}
    assert roster.of_other_revisions(Role.DECODE, "rev-gone") == {i.url for i in roster.instances(Role.DECODE)}


def test_new_members_and_new_revisions_are_seen_at_once() -> None:
    roster = roster_of({role: [f"{role.value}-old"] for role in ROLES})
    roster.set_revisions({f"{role.value}-old": OLD for role in ROLES})
    assert roster.routing_revision() == "rev-old"
    for role in ROLES:
        roster.replace(
            role,
            [
                *(i.spec for i in roster.instances(role)),
                InstanceSpec(f"http://{role.value}-new:8000", name=f"{role.value}-new"),
            ],
            healthy=True,
        )
    assert roster.routing_revision() == "rev-old"  # the new pods' revisions are not known yet
    assert roster.of_other_revisions(Role.PREFILL, "rev-old") == {"http://prefill-new:8000"}
    roster.set_revisions({**roster.revisions, **{f"{role.value}-new": NEW for role in ROLES}})
    assert roster.routing_revision() == "rev-new"
    assert roster.of_other_revisions(Role.PREFILL, "rev-new") == {"http://prefill-old:8000"}


def reference_revision(roster: Roster) -> str | None:
    """The rule read directly: revisions with a healthy instance of every role; the newest pod's wins."""
    whole = [
        r
        for r in {roster.revision_of(i) for i in roster.instances()} - {""}
        if all(any(i.healthy and roster.revision_of(i) == r for i in roster.instances(role)) for role in roster.roles)
    ]
    created = {r: max(k.created for k in roster.revisions.values() if k.revision == r) for r in whole}
    return max(whole, key=lambda r: (created[r], r)) if whole else None


@pytest.mark.parametrize("seed", range(40))
def test_the_choice_matches_the_rule_over_random_rosters_and_changes(seed: int) -> None:
    rng = random.Random(seed)
    revisions = [PodRevision(f"rev-{n}", f"2026-12-03T0{rng.randint(0, 9)}:00:00Z") for n in range(3)]
    names = {role: [f"{role.value}-{n}" for n in range(rng.randint(0, 4))] for role in ROLES}
    roster = roster_of(names)
    everyone = [name for role_names in names.values() for name in role_names]
    for _ in range(12):
        step = rng.random()
        if step < 0.4:
            roster.set_revisions({n: rng.choice(revisions) for n in everyone if rng.random() < 0.9})
        elif step < 0.8 and roster.instances():
            flipped = rng.choice(roster.instances())
            flipped.healthy = not flipped.healthy
        else:
            role = rng.choice(ROLES)
            kept = [i.spec for i in roster.instances(role) if rng.random() < 0.7]
            roster.replace(role, kept, healthy=True)
        assert roster.routing_revision() == reference_revision(roster)
        for role in ROLES:
            for revision in ["", *(r.revision for r in revisions)]:
                expected = {i.url for i in roster.instances(role) if roster.revision_of(i) != revision}
                assert roster.of_other_revisions(role, revision) == expected
