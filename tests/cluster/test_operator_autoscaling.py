"""An autoscaled role on a real control plane: the operator hands a workload's replicas over to the role's
autoscaler without a reset, writes them no more while the count moves, gives them back when autoscaling is
removed, and reports what the cluster's own HPA controller says in the Autoscaling condition.

The controller-manager here runs the real HPA controller, but the cluster serves no metrics API (no adapter, no
KEDA), so that HPA only reports that it cannot read its metric; what it would write is written by the test
through the same scale subresource (a stand-in writer, under the HPA's kind of request). KEDA's ScaledObjects
are checked against its CRD in test_operator_lifecycle (examples/e-pd-autoscaled.yaml); KEDA does not run here.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from epd_operator.api import constants as c
from tests.cluster.operator_fixtures import EXAMPLES, Kube, Operator, condition, eventually, example
from tests.cluster.test_operator_lifecycle import create, ready

pytestmark = pytest.mark.cluster
pytest_plugins = ["tests.cluster.operator_fixtures"]

EXAMPLE = next(p for p in EXAMPLES if p.name == "e-pd-shared-storage.yaml")
ADAPTER_METRIC = "vllm_num_requests_running"
AUTOSCALING = {
    "engine": "hpa",
    "minReplicas": 1,
    "maxReplicas": 4,
    "signals": [{"signal": "running", "target": 8, "adapterMetric": ADAPTER_METRIC}],
}
WATCH_S = 8.0
"""How long the replica count is sampled for a reset while the operator lets go of it."""
HPA_SYNC_S = 45.0
"""The HPA controller reconciles every 15 s; its first report comes within a few of them."""


def pd_path(ns: str, name: str) -> str:
    return f"/apis/apps/v1/namespaces/{ns}/deployments/{name}-pd"


def replicas_owners(workload: dict[str, Any]) -> set[str]:
    """The managers whose managedFields entry holds spec.replicas."""
    return {
        f"{e['manager']}/{e['operation']}{'/' + e['subresource'] if e.get('subresource') else ''}"
        for e in workload["metadata"].get("managedFields") or []
        if "f:replicas" in (e.get("fieldsV1") or {}).get("f:spec", {})
    }


def bundle_hash(workload: dict[str, Any]) -> str:
    return str(workload["spec"]["template"]["metadata"]["annotations"][c.ANNOTATION_BUNDLE_HASH])


def patch_spec(kube: Kube, ns: str, name: str, patch: dict[str, Any]) -> int:
    """A merge patch of the EPDDeployment's spec; its new generation."""
    answer = kube.merge_patch(f"/apis/{c.API_VERSION}/namespaces/{ns}/{c.PLURAL}/{name}", {"spec": patch})
    return int(answer["metadata"]["generation"])


def test_replicas_go_to_the_autoscaler_and_back_without_a_reset(
    operator: Operator, kube: Kube, op_namespace: str
) -> None:
    doc = example(EXAMPLE, op_namespace)
    doc["spec"]["decode"] = {"replicas": 2}
    create(kube, doc)
    name = doc["metadata"]["name"]
    ready(kube, op_namespace, name)
    path = pd_path(op_namespace, name)
    assert replicas_owners(kube.get(path)) == {f"{c.FIELD_MANAGER}/Apply"}
    scaling = kube.epd(op_namespace, name)
    assert condition(scaling, c.COND_AUTOSCALING)["reason"] == "NotAutoscaled"

    # Autoscaling on: the HPA appears, and the count stays 2 all along (an apply leaving out a field only it owns
    # would reset it to 1), now held by the hand-over manager, not by the operator's apply.
    generation = patch_spec(kube, op_namespace, name, {"decode": {"autoscaling": AUTOSCALING}})
    hpa_path = f"/apis/autoscaling/v2/namespaces/{op_namespace}/horizontalpodautoscalers/{name}-pd"
    seen: set[int] = set()
    deadline = time.monotonic() + WATCH_S
    while time.monotonic() < deadline:
        seen.add(kube.get(path)["spec"]["replicas"])
        time.sleep(0.05)
    assert seen == {2}
    hpa = kube.get(hpa_path)
    assert hpa["spec"]["scaleTargetRef"]["name"] == f"{name}-pd"
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == ADAPTER_METRIC
    assert replicas_owners(kube.get(path)) == {f"{c.REPLICAS_HANDOFF_MANAGER}/Apply"}
    ready(kube, op_namespace, name, generation)
    # Deleted by hand, the HPA comes back like every child.
    kube.delete(hpa_path)
    eventually(
        "the HPA restored",
        lambda: (kube.find(hpa_path) or {}).get("metadata", {}).get("uid") not in (None, hpa["metadata"]["uid"]),
    )

    # The real HPA controller cannot read the metric: Autoscaling says so with its reason; Ready stays True.
    def hpa_report() -> dict[str, Any] | None:
        cond = condition(kube.epd(op_namespace, name), c.COND_AUTOSCALING)
        return cond if cond.get("status") == "False" else None

    cond = eventually("the HPA's report in Autoscaling", hpa_report, timeout=HPA_SYNC_S, every=0.5)
    assert cond["reason"].startswith("FailedGet"), cond
    assert f"pd (HorizontalPodAutoscaler {name}-pd): ScalingActive False" in cond["message"], cond
    assert condition(kube.epd(op_namespace, name), c.COND_READY)["status"] == "True"

    # The count moves as the HPA would move it (the scale subresource); a spec change that re-renders the
    # workload keeps it, and status follows it.
    kube.request(
        "PATCH", f"{path}/scale?fieldManager=hpa-stand-in", {"spec": {"replicas": 3}}, "application/merge-patch+json"
    )
    bundle = bundle_hash(kube.get(path))
    generation = patch_spec(kube, op_namespace, name, {"decode": {"env": {"EPD_TEST_MARK": "1"}}})
    live = ready(kube, op_namespace, name, generation)
    workload = kube.get(path)
    assert workload["spec"]["replicas"] == 3
    assert bundle_hash(workload) != bundle  # the operator applied the workload again
    assert f"{c.FIELD_MANAGER}/Apply" not in replicas_owners(workload)
    assert live["status"]["roles"]["pd"]["desired"] == 3

    # Autoscaling off: the HPA is pruned and the spec's count is the operator's again.
    generation = patch_spec(kube, op_namespace, name, {"decode": {"autoscaling": None, "replicas": 2}})
    ready(kube, op_namespace, name, generation)
    assert kube.find(hpa_path) is None
    workload = kube.get(path)
    assert workload["spec"]["replicas"] == 2
    assert f"{c.FIELD_MANAGER}/Apply" in replicas_owners(workload)
    assert condition(kube.epd(op_namespace, name), c.COND_AUTOSCALING)["reason"] == "NotAutoscaled"
