"""The local runner's store roles for real (no vLLM): examples/e-p-d-store-offload.yaml's master and store client
run through epd-launch from the bundles rendered on the loopback site, and a requester set up from the
Mooncake JSON the same rendering gives the prefill instances puts and gets through them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from epd_connectors import store_probe
from epd_connectors.config.bundle import Role
from epd_operator.local import processes, profile
from epd_operator.local.plan import POD_IP

pytestmark = pytest.mark.store

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "e-p-d-store-offload.yaml"


def test_the_runner_starts_the_store_roles_and_the_store_answers(tmp_path: Path) -> None:
    plan = processes.plan_on_free_ports(EXAMPLE, tmp_path, tmp_path / "no-model", profile.CPU)
    prefill = next(i for i in plan.instances if i.role is Role.PREFILL)
    master = next(i for i in plan.instances if i.role is Role.MASTER)
    assert prefill.bundle.mooncake is not None and master.bundle.master is not None
    lines: list[str] = []
    only = {"master", "store-client"}
    with processes.deployment(plan, tmp_path, Path(sys.executable), say=lines.append, only=only) as local:
        assert sorted(r.instance.role.value for r in local.running) == ["master", "store-client"]
        store_probe.wait_for_capacity(master.bundle.master.metrics_url(POD_IP), at_least=1, timeout_s=20)
        store = store_probe.open_store(prefill.bundle.mooncake, POD_IP)
        try:
            result = store_probe.probe(store, "epd-local-runner-probe", b"x" * 4096)
        finally:
            store.close()
        assert result.size == 4096
    assert any(line.startswith("ready   ") and "store-client" in line for line in lines)
    assert any(line.startswith("stopped 2 processes") for line in lines)
