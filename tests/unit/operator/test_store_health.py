"""status.store and StoreReady from a Mooncake master's answers, and the Events a change deserves (pure)."""

from __future__ import annotations

import dataclasses

import pytest

from epd_connectors import store_probe
from epd_operator import status
from epd_operator.api import constants as c
from epd_operator.api.resource import OperatorDefaults, OperatorPeer, Owner, parse_spec
from epd_operator.api.status import StoreStatus, TenantUse
from epd_operator.render import render_desired
from epd_operator.render.store import NAMESPACE_NAME_LABEL
from epd_operator.store_health import store_events, store_status

from .test_render import example
from .test_status import EPD, all_ready, cond, facts

pytestmark = pytest.mark.unit

# The shape mooncake_master 0.3.13 answers (lines taken from a real master with one client mounted and a
# tenant policy, trimmed to what the operator reads plus some it must skip).
HEALTH = {"status": "ok", "role": "leader", "ha_state": "serving", "service_ready": True, "leader_address": None}
METRICS = """\
# HELP master_allocated_bytes Total memory bytes currently allocated across all segments
# TYPE master_allocated_bytes gauge
master_allocated_bytes 4096
master_total_capacity_bytes 268435456
segment_allocated_bytes{segment="10.0.0.7:13679"} 4096
segment_total_capacity_bytes{segment="10.0.0.7:13679"} 134217728
segment_total_capacity_bytes{segment="10.0.0.8:13679"} 134217728
master_key_count 3
master_active_clients 2
master_put_start_requests_total 7
master_put_start_latency_bucket{le="+Inf"} 7
mooncake_tenant_quota_effective_bytes{tenant_id="ns-demo"} 104857600
mooncake_tenant_quota_charged_bytes{tenant_id="ns-demo"} 4096
mooncake_tenant_quota_over_quota{tenant_id="ns-demo"} 0
mooncake_tenant_quota_effective_bytes{tenant_id="other"} 1
"""


def test_a_serving_master_reports_its_pool_clients_and_tenant() -> None:
    store = store_status(HEALTH, METRICS, "ns-demo")
    assert store == StoreStatus(
        reachable=True,
        capacity_bytes=268435456,
        used_bytes=4096,
        key_count=3,
        mounted_clients=2,
        segments=["10.0.0.7:13679", "10.0.0.8:13679"],
        tenant=TenantUse(name="ns-demo", quota_bytes=104857600, used_bytes=4096, over_quota=False),
    )
    assert store_status(HEALTH, METRICS, "no-such-tenant").tenant is None


def test_an_unreachable_or_standby_master_says_why() -> None:
    down = store_status(None, None, "t", error="http://m:9003/health: connection refused")
    assert not down.reachable and "connection refused" in down.message
    standby = store_status({**HEALTH, "role": "standby", "ha_state": "standby", "service_ready": False}, METRICS, "t")
    assert not standby.reachable and "standby" in standby.message


def test_samples_keep_labels_and_skip_comments_and_garbage() -> None:
    samples = store_probe.metric_samples('# HELP x\nx{a="1",b="q\\"uote"} 2.5\nnot a sample\ny NaN-ish\n')
    assert samples == {"x": {(("a", "1"), ("b", 'q\\"uote')): 2.5}}


SERVING = store_status(HEALTH, METRICS, "ns-demo")


def test_a_segment_that_leaves_the_pool_is_announced_with_its_address() -> None:
    one_left = SERVING.model_copy(update={"segments": ["10.0.0.7:13679"], "capacity_bytes": 134217728})
    [event] = store_events(SERVING, one_left)
    assert (event.level, event.reason) == ("warn", "StoreClientUnmounted")
    assert "10.0.0.8:13679" in event.message and "268435456 -> 134217728" in event.message
    assert store_events(one_left, SERVING) == []  # a client mounting again needs no warning


def test_nearly_full_is_announced_once_when_crossed() -> None:
    full = SERVING.model_copy(update={"used_bytes": int(0.96 * SERVING.capacity_bytes)})
    [event] = store_events(SERVING, full)
    assert event.reason == "StoreNearlyFull" and "96% full" in event.message and "spec.store.clients" in event.message
    assert store_events(full, full.model_copy(update={"used_bytes": full.used_bytes + 1})) == []


def test_a_tenant_going_over_its_quota_is_announced() -> None:
    assert SERVING.tenant is not None
    over = SERVING.model_copy(update={"tenant": SERVING.tenant.model_copy(update={"over_quota": True})})
    [event] = store_events(SERVING, over)
    assert event.reason == "TenantOverQuota" and "spec.store.tenant.quota" in event.message


def test_no_events_across_an_unreachable_reading() -> None:
    down = store_status(None, None, "t", error="refused")
    assert store_events(SERVING, down) == [] and store_events(down, SERVING) == []


def test_an_ha_leader_is_reported_and_a_new_one_announced_even_across_a_failover_gap() -> None:
    assert SERVING.leader == ""  # one master: its /health names no leader address
    leader_a = store_status({**HEALTH, "leader_address": "10.0.0.1:50051"}, METRICS, "ns-demo")
    leader_b = store_status({**HEALTH, "leader_address": "10.0.0.2:50051"}, METRICS, "ns-demo")
    standby = store_status({**HEALTH, "role": "standby", "leader_address": "10.0.0.1:50051"}, METRICS, "t")
    assert (leader_a.leader, standby.leader) == ("10.0.0.1:50051", "")
    [event] = store_events(leader_a, leader_b)
    assert (event.level, event.reason) == ("info", "StoreLeader")
    assert event.message.startswith("the master at 10.0.0.2:50051 leads (was 10.0.0.1:50051)")
    down = store_status(None, None, "t", error="refused")
    [event] = store_events(down, leader_b)
    assert event.message.startswith("the master at 10.0.0.2:50051 leads;")
    assert store_events(leader_b, leader_b.model_copy(update={"key_count": 3})) == []


def with_store(store: StoreStatus | None) -> status.Facts:
    return dataclasses.replace(facts(all_ready(EPD)), store=store)


def test_store_ready_needs_a_serving_master_with_memory_once_it_is_read() -> None:
    assert cond(status.compute(with_store(SERVING)), c.COND_STORE_READY) == ("True", status.REASON_READY)
    assert status.compute(with_store(SERVING)).store == SERVING
    down = status.compute(with_store(store_status(None, None, "t", error="timed out")))
    assert cond(down, c.COND_STORE_READY) == ("False", status.REASON_MASTER_UNREACHABLE)
    assert cond(down, c.COND_READY)[0] == "False"
    empty = status.compute(with_store(SERVING.model_copy(update={"capacity_bytes": 0, "segments": []})))
    assert cond(empty, c.COND_STORE_READY) == ("False", status.REASON_NO_CAPACITY)
    unread = status.compute(with_store(None))
    assert cond(unread, c.COND_STORE_READY) == ("True", status.REASON_READY) and unread.store is None


def test_store_ready_still_says_pods_first() -> None:
    observed = all_ready(EPD)
    observed[0] = dataclasses.replace(observed[0], ready=0)
    computed = status.compute(dataclasses.replace(facts(observed), store=SERVING))
    assert cond(computed, c.COND_STORE_READY) == ("False", status.REASON_NOT_READY)


def test_the_masters_policy_admits_the_operator_to_its_metrics_port_only() -> None:
    spec = parse_spec(example("e-pd-mooncake-cross-encoder"))
    peer = OperatorPeer("epd-system", (("app.kubernetes.io/name", "epd-operator"),))
    owner = Owner("demo", "ns", "uid-1", 1)  # the example's own name is replaced by this owner's
    desired = render_desired(owner, spec, OperatorDefaults(operator_peer=peer))
    [master] = [o for o in desired.objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"].endswith("master")]
    reader = {
        "from": [
            {
                "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "epd-system"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "epd-operator"}},
            }
        ],
        "ports": [{"port": "metrics", "protocol": "TCP"}],
    }
    assert reader in master["spec"]["ingress"]
    alone = render_desired(owner, spec, OperatorDefaults())
    [without] = [o for o in alone.objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"].endswith("master")]
    assert reader not in without["spec"]["ingress"]
    assert desired.derived.master_health_url == "http://demo-master.ns.svc:9003/health"
