"""The operator dies mid-reconcile (SIGKILL) or restarts cleanly: it converges, with nothing duplicated and,
when nothing changed, nothing written.

This module runs its own operator process, since its tests kill and restart it.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from epd_operator.api import constants as c
from epd_operator.api.resource import OperatorDefaults, Owner, parse_spec
from epd_operator.render import render_desired
from tests.cluster.operator_fixtures import (
    EPD_PATH,
    EXAMPLES,
    Kube,
    Operator,
    condition,
    eventually,
    example,
    key,
    settled,
)

pytestmark = pytest.mark.cluster
pytest_plugins = ["tests.cluster.operator_fixtures"]

OFFLOAD = next(p for p in EXAMPLES if p.name == "e-p-d-store-offload.yaml")
COPIES = 6
"""Deployments applied at once, so that a kill lands while some are half applied (3 GPUs each)."""


def small(ns: str, name: str) -> dict[str, Any]:
    """The E/P/D + store example at one replica per role (about 25 children, 3 GPUs)."""
    doc = example(OFFLOAD, ns, name)
    spec = doc["spec"]
    spec["encoder"]["replicas"] = 1
    spec["prefill"].update(replicas=1, additionalPools=[])
    spec["decode"].update(replicas=1, tensorParallelSize=1)
    spec["store"]["clients"]["replicas"] = 1
    return doc


def expected(kube: Kube, ns: str, name: str) -> set[tuple[str, str]]:
    live = kube.epd(ns, name)
    meta = live["metadata"]
    owner = Owner(meta["name"], ns, meta["uid"], meta["generation"])
    return {key(o) for o in render_desired(owner, parse_spec(live["spec"]), OperatorDefaults()).objects}


def is_ready(kube: Kube, ns: str, name: str) -> bool:
    return condition(kube.epd(ns, name), c.COND_READY).get("status") == "True"


def test_killed_mid_reconcile_converges_without_duplicates(operator: Operator, kube: Kube, op_namespace: str) -> None:
    names = [f"copy-{i}" for i in range(COPIES)]
    for name in names:
        kube.request("POST", EPD_PATH.format(ns=op_namespace), small(op_namespace, name))
    want = {name: expected(kube, op_namespace, name) for name in names}
    total = sum(len(v) for v in want.values())

    selector = f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY}"

    def started() -> bool:  # one cheap request: bundles are the first objects each reconcile applies
        return bool(kube.items(f"/api/v1/namespaces/{op_namespace}/configmaps?labelSelector={selector}"))

    eventually("the operator to start creating children", started, every=0.01)
    operator.kill()
    at_kill = sum(len(kube.children(op_namespace, name)) for name in names)
    print(f"killed with {at_kill}/{total} children created")
    assert at_kill < total, "the kill landed after the reconcile finished; nothing was interrupted"

    operator.start()
    for name in names:
        eventually(f"{name} Ready", lambda name=name: is_ready(kube, op_namespace, name))  # type: ignore[misc]
        children = kube.children(op_namespace, name)
        assert sorted(key(o) for o in children) == sorted(want[name]), "exactly the rendered children, once each"

    deployments = kube.items(f"/apis/apps/v1/namespaces/{op_namespace}/deployments?labelSelector={selector}")
    replicasets = kube.items(f"/apis/apps/v1/namespaces/{op_namespace}/replicasets")
    pods = kube.items(f"/api/v1/namespaces/{op_namespace}/pods")
    for deployment in deployments:
        uid = deployment["metadata"]["uid"]
        owned = [rs for rs in replicasets if any(r["uid"] == uid for r in rs["metadata"].get("ownerReferences") or [])]
        assert len(owned) == 1, f"{deployment['metadata']['name']}: its pod template never changed"
    assert len(pods) == sum(d["spec"]["replicas"] for d in deployments) + COPIES  # + one store client each


def test_clean_restart_writes_nothing(operator: Operator, kube: Kube, op_namespace: str) -> None:
    kube.request("POST", EPD_PATH.format(ns=op_namespace), small(op_namespace, "steady"))
    eventually("Ready", lambda: is_ready(kube, op_namespace, "steady"))

    def versions() -> dict[tuple[str, str], str]:
        found = {key(o): o["metadata"]["resourceVersion"] for o in kube.children(op_namespace, "steady")}
        found[(c.KIND, "steady")] = kube.epd(op_namespace, "steady")["metadata"]["resourceVersion"]
        return found

    before = settled("every child and the EPDDeployment", versions)
    operator.stop()
    operator.start()
    eventually(
        "the restarted operator to resume it",
        lambda: operator.metrics().get('epd_operator_reconciles_total{outcome="unchanged"}', 0) >= 1,
    )
    time.sleep(1.0)
    assert versions() == before
    assert operator.metrics().get("epd_operator_status_writes_total") == 0


def test_a_restarted_operator_counts_every_deployments_stored_phase(
    operator: Operator, kube: Kube, op_namespace: str
) -> None:
    names = [f"counted-{i}" for i in range(3)]
    for name in names:
        kube.request("POST", EPD_PATH.format(ns=op_namespace), small(op_namespace, name))
    for name in names:
        eventually(f"{name} Ready", lambda name=name: is_ready(kube, op_namespace, name))  # type: ignore[misc]
    ready_gauge = 'epd_operator_deployments{phase="Ready"}'
    eventually("the gauge counts them", lambda: operator.metrics().get(ready_gauge) == len(names))
    operator.stop()
    operator.start()
    eventually(
        "the restarted operator to resume them",
        lambda: operator.metrics().get('epd_operator_reconciles_total{outcome="unchanged"}', 0) >= len(names),
    )
    samples = operator.metrics()
    # Their status did not change, so the new process wrote none: the gauge comes from the stored status.
    assert samples.get("epd_operator_status_writes_total") == 0
    assert samples.get(ready_gauge) == len(names)
