"""Multi-tenancy on a real master started from our policy YAML: isolation, admission and quota."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from epd_connectors import store_probe
from epd_connectors.config.master import TenantQuotaPolicy
from epd_connectors.config.mooncake import MooncakeStoreConfig

if TYPE_CHECKING:
    from .conftest import Mooncake

pytestmark = pytest.mark.store

MiB = 1024**2
POLICY = TenantQuotaPolicy.model_validate(
    {"tenants": [{"name": "team-a", "quota": "4 MiB"}, {"name": "team-b", "quota": "64 MiB"}]}
)


def as_tenant(config: MooncakeStoreConfig, tenant: str) -> MooncakeStoreConfig:
    return MooncakeStoreConfig.model_validate({**config.to_json_dict(), "tenant_id": tenant})


def test_tenants_are_isolated_admitted_and_bounded(mooncake: Mooncake) -> None:
    master = mooncake.master(enable_multi_tenants=True, tenant_quota_policy=POLICY)
    # The master read back the file our model rendered (its own parser is the judge of the YAML).
    assert TenantQuotaPolicy.from_yaml(master.config.files()[master.config.tenant_quota_policy_path]) == POLICY

    owner = mooncake.client(master, global_segment_size="128 MiB", tenant_id="team-a")
    base = owner.config.requester_config(local_buffer_size="16 MiB")
    team_a = mooncake.requester(base)
    team_b = mooncake.requester(as_tenant(base, "team-b"))
    stranger = mooncake.requester(as_tenant(base, "team-c"))

    # Same key, two tenants: each reads its own value.
    assert team_a.put("shared-key", b"value of a") == 0
    assert team_b.put("shared-key", b"value of b") == 0
    assert team_a.get("shared-key") == b"value of a"
    assert team_b.get("shared-key") == b"value of b"

    # A tenant missing from the policy is refused.
    assert stranger.put("shared-key", b"value of c") == store_probe.TENANT_NOT_REGISTERED
    assert stranger.get("shared-key") == b""

    # team-a may hold 4 MiB. A value larger than the quota is refused outright.
    assert team_a.put("huge", b"a" * (5 * MiB)) == store_probe.TENANT_QUOTA_EXCEEDED
    # Over quota, the master first evicts the tenant's own unleased objects; a read leases an object for
    # default_kv_lease_ttl (10 s), so a read 3 MiB value stays and a second 3 MiB value is refused.
    assert team_a.put("big-1", b"a" * (3 * MiB)) == 0
    assert len(team_a.get("big-1")) == 3 * MiB
    assert team_a.put("big-2", b"a" * (3 * MiB)) == store_probe.TENANT_QUOTA_EXCEEDED
    # team-b's 64 MiB quota takes the same two values, and team-a's usage did not count against it.
    assert team_b.put("big-1", b"b" * (3 * MiB)) == 0
    assert len(team_b.get("big-1")) == 3 * MiB
    assert team_b.put("big-2", b"b" * (3 * MiB)) == 0


def test_over_quota_evicts_the_tenants_unread_objects(mooncake: Mooncake) -> None:
    master = mooncake.master(enable_multi_tenants=True, tenant_quota_policy=POLICY)
    owner = mooncake.client(master, global_segment_size="64 MiB", tenant_id="team-a")
    team_a = mooncake.requester(owner.config.requester_config(local_buffer_size="16 MiB"))
    assert team_a.put("unread-1", b"a" * (3 * MiB)) == 0
    assert team_a.put("unread-2", b"a" * (3 * MiB)) == 0
    assert team_a.get("unread-1") == b""
    assert len(team_a.get("unread-2")) == 3 * MiB
