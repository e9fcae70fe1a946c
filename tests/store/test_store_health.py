"""The operator's reading of a real master (store_watch.read_master, store_health): the pool, its keys, the
mounted segments, the tenant's quota, a client that goes, a pool that fills, a master that stops."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from epd_connectors.config.master import TenantQuotaPolicy
from epd_operator.api.status import StoreStatus
from epd_operator.store_health import NEARLY_FULL_RATIO, store_events
from epd_operator.store_watch import read_master

if TYPE_CHECKING:
    from .conftest import Mooncake, RunningMaster

pytestmark = pytest.mark.store

MiB = 1024**2
TENANT = "team-a"


def read(master: RunningMaster, tenant: str = TENANT) -> StoreStatus:
    return asyncio.run(read_master(master.config.health_url("127.0.0.1"), master.metrics_url, tenant))


def eventually(
    master: RunningMaster, wanted: str, check: Callable[[StoreStatus], bool], timeout_s: float = 30
) -> StoreStatus:
    deadline = time.monotonic() + timeout_s
    while True:
        reading = read(master)
        if check(reading):
            return reading
        assert time.monotonic() < deadline, f"no reading with {wanted} in {timeout_s} s; last: {reading}"
        time.sleep(0.2)


def test_the_pool_its_keys_segments_and_tenant_then_a_client_that_goes(mooncake: Mooncake) -> None:
    policy = TenantQuotaPolicy.model_validate({"tenants": [{"name": TENANT, "quota": "8 MiB"}]})
    master = mooncake.master(enable_multi_tenants=True, tenant_quota_policy=policy, client_ttl_s=2)
    first = mooncake.client(master, global_segment_size="64 MiB", tenant_id=TENANT)
    second = mooncake.client(master, global_segment_size="32 MiB", tenant_id=TENANT)

    empty = read(master)
    assert empty.reachable and empty.capacity_bytes == 96 * MiB and empty.key_count == 0
    assert empty.mounted_clients == 2 and len(empty.segments) == 2
    assert empty.tenant is not None and (empty.tenant.quota_bytes, empty.tenant.used_bytes) == (8 * MiB, 0)

    requester = mooncake.requester(first.config.requester_config(local_buffer_size="16 MiB"))
    for n in range(3):
        assert requester.put(f"health/{n}", bytes([n]) * MiB) == 0
    filled = read(master)
    assert filled.key_count == 3 and filled.used_bytes >= 3 * MiB
    assert filled.tenant is not None and filled.tenant.used_bytes >= 3 * MiB and not filled.tenant.over_quota

    second.process.stop()  # SIGKILL: the master drops its segment once its heartbeats lapse (client_ttl_s)
    left = eventually(master, "one segment", lambda r: len(r.segments) == 1)
    assert left.capacity_bytes == 64 * MiB
    [event] = [e for e in store_events(filled, left) if e.reason == "StoreClientUnmounted"]
    [gone] = set(filled.segments) - set(left.segments)
    assert gone in event.message

    master.process.stop()
    down = read(master)
    assert not down.reachable and master.config.health_url("127.0.0.1") in down.message


def test_a_pool_filling_past_nearly_full_is_announced(mooncake: Mooncake) -> None:
    # No eviction before the pool is full, so puts fill it.
    master = mooncake.master(eviction_high_watermark_ratio=1.0)
    owner = mooncake.client(master, global_segment_size="16 MiB")
    requester = mooncake.requester(owner.config.requester_config(local_buffer_size="16 MiB"))
    before = read(master, tenant="")
    for n in range(16):
        if requester.put(f"fill/{n}", b"f" * MiB) != 0:
            break
    after = read(master, tenant="")
    assert after.used_bytes >= NEARLY_FULL_RATIO * after.capacity_bytes, after
    assert [e.reason for e in store_events(before, after)] == ["StoreNearlyFull"]
