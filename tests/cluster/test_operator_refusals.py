"""What the operator refuses to do, and what it reports when the API server refuses it, on a real control plane:
it never applies over an object another EPDDeployment controls (NameConflict on the newcomer, the other left as
it is, even when the newcomer is deleted), a child the server refuses sets Ready=False with the server's message,
and a namespace being deleted is left alone (no re-created children, no repairs, no Event retries).
"""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest

from epd_operator.api import constants as c
from tests.cluster.operator_fixtures import (
    EPD_PATH,
    EXAMPLES,
    ApiError,
    Kube,
    Operator,
    condition,
    eventually,
    example,
    key,
)
from tests.cluster.test_operator_children import path_of
from tests.cluster.test_operator_lifecycle import create, ready, rendered

pytestmark = pytest.mark.cluster
pytest_plugins = ["tests.cluster.operator_fixtures"]

SMALL = next(p for p in EXAMPLES if p.name == "e-pd-shared-storage.yaml")
"""Encoder, PD and proxy, no store: 15 children."""
STORE = next(p for p in EXAMPLES if p.name == "e-pd-mooncake-cross-encoder.yaml")
"""A child of every managed kind but DaemonSet (24)."""
GC_S = 5.0
"""The garbage collector deletes an orphan's dependents within a second or two."""


def reason_of(kube: Kube, ns: str, name: str, reason: str) -> dict[str, Any] | None:
    """The Ready condition once it is False with `reason`."""
    ready_now = condition(kube.epd(ns, name), c.COND_READY)
    return ready_now if (ready_now.get("status"), ready_now.get("reason")) == ("False", reason) else None


def test_a_newcomer_never_takes_over_another_deployments_objects(
    operator: Operator, kube: Kube, op_namespace: str
) -> None:
    ns = op_namespace
    create(kube, example(SMALL, ns, "b"))
    ready(kube, ns, "b")
    # The newcomer "n" needs n-encoder (Service, PDB) and n-encoder-bundle. Objects of those names exist,
    # controlled by "b" and written by the operator's own field manager, as when two deployments' names
    # collided (issue 14: the newcomer's apply then took them over and its deletion collected them).
    theirs: list[dict[str, Any]] = []
    for obj in rendered(kube, ns, "b").objects:
        if obj["metadata"]["name"] in ("b-encoder", "b-encoder-bundle") and obj["kind"] != "Deployment":
            copied = copy.deepcopy(obj)
            copied["metadata"]["name"] = "n" + obj["metadata"]["name"][1:]
            kube.apply(copied, manager=c.FIELD_MANAGER)
            theirs.append(copied)
    assert sorted(key(o) for o in theirs) == [
        ("ConfigMap", "n-encoder-bundle"),
        ("PodDisruptionBudget", "n-encoder"),
        ("Service", "n-encoder"),
    ]
    before = {key(o): kube.get(path_of(o)) for o in theirs}
    b_children = {key(o): o["metadata"]["uid"] for o in kube.children(ns, "b")}

    kube.request("POST", EPD_PATH.format(ns=ns), example(SMALL, ns, "n"))
    reported = eventually("n reports a NameConflict", lambda: reason_of(kube, ns, "n", "NameConflict"))
    for kind, name in before:
        assert f"{kind} {name} belongs to EPDDeployment b" in reported["message"]
    assert "Fix:" in reported["message"]
    assert kube.epd(ns, "n")["status"]["observedGeneration"] == 1
    assert kube.children(ns, "n") == [], "nothing of the newcomer was applied"
    for k, was in before.items():
        now = kube.get(path_of(was))
        assert now["metadata"]["resourceVersion"] == was["metadata"]["resourceVersion"], f"{k} was written"
        assert now["metadata"]["ownerReferences"] == was["metadata"]["ownerReferences"]

    kube.request("DELETE", EPD_PATH.format(ns=ns) + "/n", {"propagationPolicy": "Background"})
    eventually("n gone", lambda: kube.find(EPD_PATH.format(ns=ns) + "/n") is None)
    time.sleep(GC_S)
    for k, was in before.items():
        assert kube.find(path_of(was)) is not None, f"{k} was collected with the newcomer"
    assert {key(o): o["metadata"]["uid"] for o in kube.children(ns, "b")} == b_children
    service = next(o for o in theirs if o["kind"] == "Service")
    assert kube.get(path_of(service))["spec"]["selector"] == service["spec"]["selector"], "still b's pods"
    assert condition(kube.epd(ns, "b"), c.COND_READY).get("status") == "True"


def _policy(ns: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A ValidatingAdmissionPolicy refusing the proxy's bundle ConfigMap in `ns` (and its binding)."""
    name = f"refuse-{ns}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["configmaps"],
                    }
                ]
            },
            "validations": [
                {
                    "expression": "!object.metadata.name.endsWith('-proxy-bundle')",
                    "message": "this test's admission policy refuses the proxy bundle",
                    "reason": "Invalid",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}},
        },
    }
    return policy, binding


def test_a_child_the_api_server_refuses_sets_ready_false_with_its_message(
    operator: Operator, kube: Kube, op_namespace: str
) -> None:
    ns = op_namespace
    policy, binding = _policy(ns)
    admission = "/apis/admissionregistration.k8s.io/v1"
    for obj, plural in ((policy, "validatingadmissionpolicies"), (binding, "validatingadmissionpolicybindings")):
        path = f"{admission}/{plural}/{obj['metadata']['name']}?fieldManager=epd-tests&force=true"
        kube.request("PATCH", path, obj, "application/apply-patch+yaml")
    try:
        probe = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x-proxy-bundle", "namespace": ns}}

        def refused() -> bool:  # the policy takes effect a moment after it is created
            try:
                kube.request("POST", f"/api/v1/namespaces/{ns}/configmaps?dryRun=All", probe)
            except ApiError as exc:
                return exc.status == 422
            return False

        eventually("the admission policy to refuse", refused)
        create(kube, example(SMALL, ns, "refused"))
        reported = eventually("Ready=False ApplyFailed", lambda: reason_of(kube, ns, "refused", "ApplyFailed"))
        assert "this test's admission policy refuses the proxy bundle" in reported["message"]
        assert "refused-proxy-bundle" in reported["message"]
        st = kube.epd(ns, "refused")["status"]
        assert st["observedGeneration"] == 1 and reported["observedGeneration"] == 1
    finally:
        kube.delete(f"{admission}/validatingadmissionpolicybindings/{binding['metadata']['name']}")
        kube.delete(f"{admission}/validatingadmissionpolicies/{policy['metadata']['name']}")


def test_a_namespace_being_deleted_is_left_alone(operator: Operator, kube: Kube, op_namespace: str) -> None:
    ns = op_namespace
    create(kube, example(STORE, ns, "going"))
    ready(kube, ns, "going")
    children = len(kube.children(ns, "going"))
    log_at, before = operator.size(), operator.metrics()
    kube.request("DELETE", f"/api/v1/namespaces/{ns}", {"propagationPolicy": "Background"})
    eventually("the namespace gone", lambda: kube.find(f"/api/v1/namespaces/{ns}") is None, timeout=120)
    time.sleep(GC_S)  # any retry the operator scheduled would come within this
    log = operator.tail(log_at, lines=100000)
    after = operator.metrics()

    def grew(prefix: str) -> float:
        return sum(v - before.get(k, 0) for k, v in after.items() if k.startswith(prefix))

    print(f"{children} children; operator log lines while the namespace went: {len(log.splitlines())}")
    assert grew("epd_operator_repairs_total") == 0, "children re-created in a terminating namespace"
    assert grew("epd_operator_reconcile_errors_total") == 0
    for sign in ("RepairFailed", "applied again", "Failed to post", "Restored", "Traceback"):
        assert sign not in log, f"{sign!r} in the operator's log:\n{log[-3000:]}"
