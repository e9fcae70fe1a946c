"""Status from observed workloads: counts, rolesReady strings, conditions with their reasons, phase, and the
rule that an unchanged world gives an equal status (so nothing is written)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from epd_connectors.config.roles import Role
from epd_operator import status
from epd_operator.api import constants as c
from epd_operator.api.status import EPDDeploymentStatus
from epd_operator.render import Derived, RoleWorkload

pytestmark = pytest.mark.unit

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"
DERIVED = Derived(
    tenant_id="ns-demo",
    embedding_cache_prefix="emb-1",
    kv_cache_prefix="kv-1",
    store_tp_size=2,
    python_hash_seed=1234,
    endpoint="http://demo-proxy.ns.svc:8000",
    model_revision="0123456789abcdef",
)

EPD = [
    RoleWorkload(Role.MASTER, "Deployment", "demo-master", 1),
    RoleWorkload(Role.STORE_CLIENT, "DaemonSet", "demo-store-client", None),
    RoleWorkload(Role.ENCODER, "Deployment", "demo-encoder", 2),
    RoleWorkload(Role.PREFILL, "Deployment", "demo-prefill", 1),
    RoleWorkload(Role.PREFILL, "Deployment", "demo-prefill-tp2", 1),
    RoleWorkload(Role.DECODE, "StatefulSet", "demo-decode", 1),
    RoleWorkload(Role.PROXY, "Deployment", "demo-proxy", 1),
]
PD = [
    RoleWorkload(Role.ENCODER, "Deployment", "demo-encoder", 1),
    RoleWorkload(Role.PD, "Deployment", "demo-pd", 2),
    RoleWorkload(Role.PROXY, "Deployment", "demo-proxy", 1),
]


def live(w: RoleWorkload, ready: int | None = None, updated: int | None = None, settled: bool = True) -> dict[str, Any]:
    n = w.replicas if w.replicas is not None else 4
    r = n if ready is None else ready
    u = n if updated is None else updated
    meta = {"name": w.name, "generation": 2}
    if w.kind == "DaemonSet":
        st = {"desiredNumberScheduled": n, "numberReady": r, "updatedNumberScheduled": u, "currentNumberScheduled": n}
    else:
        st = {"readyReplicas": r, "updatedReplicas": u, "replicas": n}
    return {"metadata": meta, "spec": {"replicas": n}, "status": {**st, "observedGeneration": 2 if settled else 1}}


def facts(
    observed: list[status.Observed] | None,
    previous: EPDDeploymentStatus | None = None,
    problems: list[str] | None = None,
    now: str = T0,
    generation: int = 2,
) -> status.Facts:
    return status.Facts(
        generation=generation,
        problems=problems or [],
        observed=observed,
        derived=DERIVED if observed is not None else None,
        previous=previous or EPDDeploymentStatus(),
        now=now,
    )


def all_ready(workloads: list[RoleWorkload]) -> list[status.Observed]:
    return [status.observe(w, live(w)) for w in workloads]


def cond(st: EPDDeploymentStatus, kind: str) -> tuple[str, str]:
    found = next(x for x in st.conditions if x.type == kind)
    return found.status, found.reason


def test_everything_ready() -> None:
    st = status.compute(facts(all_ready(EPD)))
    assert [x.type for x in st.conditions] == list(c.CONDITION_TYPES)
    assert all(x.status == "True" for x in st.conditions if x.type != c.COND_REDUNDANT)  # one decode, one proxy
    assert all(x.observed_generation == 2 and x.last_transition_time == T0 for x in st.conditions)
    assert st.phase == "Ready"
    assert st.observed_generation == 2
    assert st.roles_ready == {"encoder": "2/2", "prefill": "2/2", "decode": "1/1", "store": "5/5", "proxy": "1/1"}
    assert set(st.roles) == {"master", "storeClients", "encoder", "prefill", "decode", "proxy"}
    assert st.roles["storeClients"].model_dump() == {"desired": 4, "ready": 4, "updated": 4, "current": 4}
    assert (st.endpoint, st.tenant_id, st.embedding_cache_prefix, st.kv_cache_prefix, st.store_tp_size) == (
        "http://demo-proxy.ns.svc:8000",
        "ns-demo",
        "emb-1",
        "kv-1",
        2,
    )


def test_wire_form_is_camel_case_and_matches_the_printer_columns() -> None:
    wire = status.to_json(status.compute(facts(all_ready(EPD))))
    assert {"observedGeneration", "rolesReady", "embeddingCachePrefix", "kvCachePrefix", "storeTpSize"} <= set(wire)
    assert {"observedGeneration", "lastTransitionTime"} <= set(wire["conditions"][0])
    assert status.parse(wire) == status.compute(facts(all_ready(EPD)))


def test_combined_pd_without_store() -> None:
    st = status.compute(facts(all_ready(PD)))
    assert cond(st, c.COND_PREFILL_READY) == ("True", status.REASON_NOT_REQUIRED)
    assert cond(st, c.COND_STORE_READY) == ("True", status.REASON_NOT_REQUIRED)
    assert cond(st, c.COND_DECODE_READY) == ("True", status.REASON_READY)
    assert st.roles_ready == {"encoder": "1/1", "pd": "2/2", "proxy": "1/1"}
    assert st.phase == "Ready"


def test_an_unchanged_world_gives_an_equal_status_and_keeps_transition_times() -> None:
    first = status.compute(facts(all_ready(EPD), now=T0))
    again = status.compute(facts(all_ready(EPD), previous=first, now=T1))
    assert again == first


def test_transition_time_moves_only_for_the_condition_that_flips() -> None:
    first = status.compute(facts(all_ready(EPD), now=T0))
    observed = [status.observe(w, live(w, ready=1 if w.role == Role.ENCODER else None)) for w in EPD]
    second = status.compute(facts(observed, previous=first, now=T1))
    times = {x.type: x.last_transition_time for x in second.conditions}
    assert times[c.COND_ENCODERS_READY] == T1 and times[c.COND_READY] == T1
    assert times[c.COND_DECODE_READY] == T0 and times[c.COND_VALID] == T0
    assert cond(second, c.COND_ENCODERS_READY) == ("False", status.REASON_NOT_READY)
    assert "Deployment demo-encoder: 1/2 ready" in next(x.message for x in second.conditions if x.type == "Ready")
    assert second.phase == "Degraded"  # was Ready at this generation, nothing rolling
    assert [x.type for x in status.flips(first, second)] == [c.COND_ENCODERS_READY, c.COND_READY]


@pytest.mark.parametrize(
    ("observation", "reason"),
    [
        ({"live": None}, status.REASON_MISSING),
        ({"settled": False}, status.REASON_ROLLING),
        ({"updated": 1}, status.REASON_ROLLING),
        ({"ready": 0}, status.REASON_NOT_READY),
    ],
)
def test_role_reasons(observation: dict[str, Any], reason: str) -> None:
    enc = EPD[2]
    body = None if "live" in observation else live(enc, **observation)
    observed = [status.observe(w, body) if w is enc else status.observe(w, live(w)) for w in EPD]
    st = status.compute(facts(observed, generation=3))
    assert cond(st, c.COND_ENCODERS_READY) == ("False", reason)
    assert cond(st, c.COND_READY) == ("False", status.REASON_ROLES_NOT_READY)
    assert st.phase == "Progressing"


def test_the_most_telling_reason_wins() -> None:
    pools = [w for w in EPD if w.role == Role.PREFILL]
    observed = [status.observe(pools[0], live(pools[0], ready=0)), status.observe(pools[1], None)]
    st = status.compute(facts(observed))
    assert cond(st, c.COND_PREFILL_READY) == ("False", status.REASON_MISSING)


def test_new_deployment_is_pending_until_something_is_ready() -> None:
    nothing = [status.observe(w, live(w, ready=0)) for w in PD]
    st = status.compute(facts(nothing))
    assert st.phase == "Pending"
    some = [status.observe(w, live(w, ready=1 if w.role == Role.PROXY else 0)) for w in PD]
    assert status.compute(facts(some, previous=st)).phase == "Progressing"


def test_invalid_spec_before_anything_was_created() -> None:
    st = status.compute(facts(None, problems=["spec.x = 1: bad. Fix: do y", "spec.z: also bad"]))
    assert cond(st, c.COND_VALID) == ("False", status.REASON_INVALID)
    assert next(x.message for x in st.conditions if x.type == "Valid") == "spec.x = 1: bad. Fix: do y; spec.z: also bad"
    assert cond(st, c.COND_READY) == ("False", status.REASON_INVALID)
    assert cond(st, c.COND_ENCODERS_READY) == ("Unknown", status.REASON_INVALID)
    assert st.phase == "Invalid"
    assert st.roles == {} and st.endpoint == ""


def test_invalid_change_keeps_reporting_the_running_children() -> None:
    ready = status.compute(facts(all_ready(PD)))
    st = status.compute(facts(all_ready(PD), previous=ready, problems=["spec.x: bad"], now=T1, generation=3))
    assert st.phase == "Invalid"
    assert cond(st, c.COND_DECODE_READY) == ("True", status.REASON_READY)
    assert st.roles_ready["pd"] == "2/2"
    assert st.endpoint == DERIVED.endpoint
    assert "still follow the last valid spec" in next(x.message for x in st.conditions if x.type == "Ready")


def test_daemonset_desired_comes_from_its_status() -> None:
    ds = EPD[1]
    observed = status.observe(ds, live(ds, ready=3))
    assert (observed.desired, observed.ready, observed.updated) == (4, 3, 4)
    assert observed.state[1] == status.REASON_NOT_READY


def test_deleting_workload_counts_as_missing() -> None:
    body = live(EPD[0])
    body["metadata"]["deletionTimestamp"] = T0
    assert status.observe(EPD[0], body).state[1] == status.REASON_MISSING


def test_unreadable_stored_status_parses_as_empty() -> None:
    assert status.parse({"phase": "Exploded"}) == EPDDeploymentStatus()
    assert status.parse(None) == EPDDeploymentStatus()


def test_condition_types_cover_every_role_condition() -> None:
    assert [kind for kind, _, _ in status.ROLE_CONDITIONS] == list(c.CONDITION_TYPES[1:-4])
    assert c.CONDITION_TYPES[-4:] == (c.COND_TRANSFER_READY, c.COND_READY, c.COND_REDUNDANT, c.COND_AUTOSCALING)


def test_redundant_names_each_serving_role_with_one_replica_over_its_pools() -> None:
    # EPD: two encoders, two prefill pools of one replica each, one decode, one proxy (a store of one master).
    st = status.compute(facts(all_ready(EPD)))
    redundant = next(x for x in st.conditions if x.type == c.COND_REDUNDANT)
    assert (redundant.status, redundant.reason) == ("False", status.REASON_SINGLE_REPLICA)
    assert redundant.message.startswith("decode has one replica") and "proxy has one replica" in redundant.message
    assert "prefill" not in redundant.message and "encoder" not in redundant.message
    assert st.phase == "Ready", "not part of Ready"
    doubled = [replace(w, replicas=2) if w.role in (Role.DECODE, Role.PROXY) else w for w in EPD]
    st = status.compute(facts(all_ready(doubled)))
    assert cond(st, c.COND_REDUNDANT) == ("True", status.REASON_REPLICATED)
    single_encoder = status.compute(facts(all_ready(PD)))
    assert "encoder has one replica: losing its pod stops media requests" in next(
        x.message for x in single_encoder.conditions if x.type == c.COND_REDUNDANT
    )


def test_only_a_first_status_a_new_generation_ready_or_a_condition_lost_is_urgent() -> None:
    """Everything else is progress, which publish writes at most once per interval."""
    coming = [status.observe(w, live(w, ready=0)) for w in PD]
    written = status.compute(facts(coming))
    assert status.urgent(EPDDeploymentStatus(), written), "the first status"
    one_up = [status.observe(w, live(w, ready=1 if w.role == Role.PROXY else 0)) for w in PD]
    progress = status.compute(facts(one_up, previous=written))
    assert cond(progress, c.COND_PROXY_READY) == ("True", status.REASON_READY)
    assert not status.urgent(written, progress), "a role coming up, counts and messages"
    assert status.urgent(written, status.compute(facts(one_up, previous=written, generation=3))), "a new spec"
    ready = status.compute(facts(all_ready(PD), previous=progress))
    assert status.urgent(progress, ready), "Ready flipped"
    lost = status.compute(facts(one_up, previous=ready))
    assert status.urgent(ready, lost), "a condition that held no longer does"
    blocked = status.compute(
        replace(facts(coming, previous=written), blocked=(status.REASON_NAME_CONFLICT, "in the way"))
    )
    assert cond(blocked, c.COND_READY)[0] == cond(written, c.COND_READY)[0] == "False"
    assert status.urgent(written, blocked) and status.urgent(blocked, written), "Ready's reason changed"
