"""The store as its Mooncake master reports it: /health and /metrics read into status.store, and the Events a
change deserves. Pure; `store_watch` fetches what this reads.

Pod readiness says the master process answers its probe; only the master's own figures say whether the pool
has memory (no store client mounted means every put fails) and whether it is filling faster than eviction
frees it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from epd_connectors.store_probe import Labels, metric_samples, serves
from epd_operator.api.status import StoreStatus, TenantUse

NEARLY_FULL_RATIO = 0.95
"""Used over capacity at which the pool counts as nearly full. The master evicts from 0.9 (its default
watermark), so a pool whose eviction keeps up stays below this, and one that crosses it is refusing puts soon."""


class StoreEvent(NamedTuple):
    """An Event to post on the EPDDeployment."""

    level: str
    """info or warn."""
    reason: str
    message: str


def _gauge(samples: Mapping[str, Mapping[Labels, float]], name: str) -> int:
    return int(samples.get(name, {}).get((), 0))


def _tenant(samples: Mapping[str, Mapping[Labels, float]], tenant_id: str) -> TenantUse | None:
    key = (("tenant_id", tenant_id),)
    quota = samples.get("mooncake_tenant_quota_effective_bytes", {}).get(key)
    if quota is None:
        return None
    return TenantUse(
        name=tenant_id,
        quota_bytes=int(quota),
        used_bytes=int(samples.get("mooncake_tenant_quota_charged_bytes", {}).get(key, 0)),
        over_quota=bool(samples.get("mooncake_tenant_quota_over_quota", {}).get(key, 0)),
    )


def store_status(health: Mapping[str, Any] | None, metrics: str | None, tenant_id: str, error: str = "") -> StoreStatus:
    """status.store from the master's answers; `error` says why there are none (unreachable, refused)."""
    if error or health is None or metrics is None:
        return StoreStatus(reachable=False, message=error or "the master gave no answer")
    if not serves(health):
        state = f"role {health.get('role', '?')}, {health.get('ha_state', health.get('status', '?'))}"
        return StoreStatus(reachable=False, message=f"the master does not serve ({state})")
    samples = metric_samples(metrics)
    segments = samples.get("segment_total_capacity_bytes", {})
    return StoreStatus(
        reachable=True,
        capacity_bytes=_gauge(samples, "master_total_capacity_bytes"),
        used_bytes=_gauge(samples, "master_allocated_bytes"),
        key_count=_gauge(samples, "master_key_count"),
        mounted_clients=_gauge(samples, "master_active_clients"),
        segments=sorted(dict(labels).get("segment", "") for labels in segments),
        tenant=_tenant(samples, tenant_id),
        leader=str(health.get("leader_address") or "") if health.get("role") == "leader" else "",
    )


def fill_ratio(store: StoreStatus) -> float:
    return store.used_bytes / store.capacity_bytes if store.capacity_bytes else 0.0


def store_events(before: StoreStatus | None, after: StoreStatus) -> list[StoreEvent]:
    """What changed between two readings that someone should hear about: a new HA leader, a segment that left
    the pool, the pool crossing into nearly full, the tenant going over its quota. The master's reachability is
    StoreReady's (its flip is announced with the condition)."""
    events: list[StoreEvent] = []
    previous = before.leader if before is not None else ""
    if after.leader and after.leader != previous:
        # A failover passes through readings without a leader, so the last one named is not always at hand.
        was = f" (was {previous})" if previous else ""
        events.append(
            StoreEvent(
                "info",
                "StoreLeader",
                f"the master at {after.leader} leads{was}; clients follow the leader by themselves, and a new "
                "leader starts with an empty store (Mooncake replicates no keys without its oplog)",
            )
        )
    if before is None or not before.reachable or not after.reachable:
        return events
    for segment in sorted(set(before.segments) - set(after.segments)):
        events.append(
            StoreEvent(
                "warn",
                "StoreClientUnmounted",
                f"segment {segment} left the pool (capacity {before.capacity_bytes} -> {after.capacity_bytes} "
                "bytes): its store client stopped or lost the master; see that pod's log",
            )
        )
    if fill_ratio(after) >= NEARLY_FULL_RATIO > fill_ratio(before):
        events.append(
            StoreEvent(
                "warn",
                "StoreNearlyFull",
                f"the pool is {100 * fill_ratio(after):.0f}% full ({after.used_bytes} of {after.capacity_bytes} "
                "bytes) and eviction is not keeping up: add store clients or raise their segment size "
                "(spec.store.clients)",
            )
        )
    if after.tenant is not None and after.tenant.over_quota and not (before.tenant and before.tenant.over_quota):
        events.append(
            StoreEvent(
                "warn",
                "TenantOverQuota",
                f"tenant {after.tenant.name} is over its quota ({after.tenant.used_bytes} of "
                f"{after.tenant.quota_bytes} bytes): the master refuses its puts; raise spec.store.tenant.quota",
            )
        )
    return events
