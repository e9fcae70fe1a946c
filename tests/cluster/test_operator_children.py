"""Children deleted or changed by hand, against a real control plane: every kind comes back as rendered within
moments, a hand edit of a field the operator owns is reverted, anything else is left alone, and once repaired
the operator writes nothing (it does not fight its own applies).

Writes are counted on both sides: the API server's own request counter (server-side applies to the managed
kinds, `apiserver_request_total{verb="APPLY"}`) and the operator's log line for each repair.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from epd_operator import apply
from epd_operator.api import constants as c
from tests.cluster.operator_fixtures import EXAMPLES, Kube, Operator, eventually, example, key, settled
from tests.cluster.test_operator_lifecycle import create, mismatches, ready, rendered

pytestmark = pytest.mark.cluster
pytest_plugins = ["tests.cluster.operator_fixtures"]

EXAMPLE = next(p for p in EXAMPLES if p.name == "e-pd-mooncake-cross-encoder.yaml")
"""Has a child of every managed kind but DaemonSet and the autoscalers (24 in all)."""
RESTORE_S = 5.0
"""A repair follows the watch event at once; seconds absorb a loaded machine."""
QUIET_S = 10.0
"""How long the repaired deployment must then stay unwritten (the 60 s check is in test_operator_lifecycle)."""
REPAIRED = re.compile(r"applied again \((written|no-op)\)")
"""The operator's log line of one repair."""
_PLURALS = {k.plural: k.kind for k in apply.MANAGED_KINDS}


def path_of(obj: dict[str, Any]) -> str:
    kind = apply.kind_of(obj)
    return kind.collection(obj["metadata"]["namespace"]) + f"/{obj['metadata']['name']}"


def applies(kube: Kube) -> int:
    """Server-side apply requests the API server has answered so far for the managed kinds."""
    response = kube.api.call_api("GET", kube.api.configuration.host + "/metrics", _request_timeout=30)
    text = response.read().decode()  # type: ignore[no-untyped-call]
    total = 0
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{") and 'verb="APPLY"' in line and 'subresource=""' in line:
            resource = re.search(r'resource="([^"]*)"', line)
            if resource and resource.group(1) in _PLURALS:
                total += int(float(line.rpartition(" ")[2]))
    return total


def repairs(operator: Operator, since: int) -> list[str]:
    """What the operator logged repairing since that log offset: 'written' or 'no-op', one per repair."""
    return REPAIRED.findall(operator.tail(since, lines=100000))


def deployed(kube: Kube, ns: str) -> tuple[str, list[dict[str, Any]]]:
    """The example, Ready; its name and rendered children."""
    doc = example(EXAMPLE, ns)
    create(kube, doc)
    name = doc["metadata"]["name"]
    ready(kube, ns, name)
    return name, rendered(kube, ns, name).objects


def test_every_deleted_child_kind_comes_back_as_rendered(operator: Operator, kube: Kube, op_namespace: str) -> None:
    _, objects = deployed(kube, op_namespace)
    victims: dict[str, dict[str, Any]] = {}
    for obj in objects:  # the first child of each kind the workload watches did not cover before
        if obj["kind"] not in apply.WORKLOAD_KINDS:
            victims.setdefault(obj["kind"], obj)
    # The autoscalers' kinds are deleted and restored in test_operator_autoscaling.
    assert set(victims) == {k.kind for k in apply.MANAGED_KINDS} - apply.WORKLOAD_KINDS - apply.AUTOSCALER_KINDS
    applies_before, log_at = applies(kube), operator.size()

    latencies: dict[str, float] = {}
    for kind, obj in victims.items():
        path = path_of(obj)
        uid = kube.get(path)["metadata"]["uid"]
        kube.request("DELETE", path)
        deleted = time.monotonic()

        def back(path: str = path, uid: str = uid) -> dict[str, Any] | None:
            found = kube.find(path)
            return found if found is not None and found["metadata"]["uid"] != uid else None

        restored = eventually(f"{kind} {obj['metadata']['name']} back", back, timeout=RESTORE_S, every=0.02)
        latencies[kind] = time.monotonic() - deleted
        assert mismatches(restored, obj) == [], key(obj)

    print("restored in: " + ", ".join(f"{k} {s * 1000:.0f} ms" for k, s in latencies.items()))
    time.sleep(1.0)  # let the echo of each restore reach the operator
    assert repairs(operator, log_at) == ["written"] * len(victims), "one repair per deletion, none after"
    counted = operator.metrics()
    for kind in latencies:
        sample = f'epd_operator_repairs_total{{cause="deleted",kind="{kind}"}}'
        assert counted.get(sample, 0) >= 1, f"{sample} not counted"
    assert applies(kube) - applies_before == len(victims), "one apply per deletion: the echoes cost nothing"


def test_hand_edits_of_owned_fields_are_reverted_and_the_rest_left_alone(
    operator: Operator, kube: Kube, op_namespace: str
) -> None:
    name, objects = deployed(kube, op_namespace)
    by_key = {key(o): o for o in objects}
    bundle = next(o for o in objects if o["kind"] == "ConfigMap")
    service = next(o for o in objects if o["kind"] == "Service" and o["spec"].get("clusterIP") == "None")
    workload = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-encoder"))
    binding = next(o for o in objects if o["kind"] == "RoleBinding")
    as_user = "?fieldManager=someone"
    log_at = operator.size()

    edits: list[tuple[dict[str, Any], str, Any, str]] = [
        # (child, patch type, patch, what it does)
        (bundle, "merge", {"data": dict.fromkeys(bundle["data"], "{}")}, "the role's bundle replaced"),
        (service, "json", [{"op": "replace", "path": "/spec/ports/0/port", "value": 8080}], "a port renumbered"),
        (workload, "merge", {"spec": {"replicas": 5}}, "scaled by hand"),
        (
            binding,
            "json",
            [{"op": "remove", "path": "/metadata/labels/" + c.LABEL_MANAGED_BY.replace("/", "~1")}],
            "our label removed (the watch sees the binding leave)",
        ),
    ]
    for obj, kind, patch, what in edits:
        content_type = "application/merge-patch+json" if kind == "merge" else "application/json-patch+json"
        edited = kube.request("PATCH", path_of(obj) + as_user, patch, content_type)
        assert mismatches(edited, obj) != [], f"{key(obj)}: {what} took effect"
        began = time.monotonic()

        def drift(obj: dict[str, Any] = obj) -> list[str]:
            return mismatches(kube.get(path_of(obj)), obj)

        eventually(
            f"{key(obj)} reverted after {what}", lambda: drift() == [], RESTORE_S, 0.02, lambda: "\n".join(drift())
        )
        print(f"{key(obj)} {what}: reverted in {(time.monotonic() - began) * 1000:.0f} ms")
    ports = kube.get(path_of(service))["spec"]["ports"]
    assert [p["port"] for p in ports] == [p["port"] for p in service["spec"]["ports"]], "no port left behind"

    # A field the operator does not own is someone else's: not reverted, not even re-applied.
    annotated = kube.merge_patch(path_of(bundle) + as_user, {"metadata": {"annotations": {"note": "mine"}}})
    time.sleep(1.0)
    still = kube.get(path_of(bundle))
    assert still["metadata"]["annotations"] == {"note": "mine"}
    assert still["metadata"]["resourceVersion"] == annotated["metadata"]["resourceVersion"]
    done = repairs(operator, log_at)
    print(f"repairs: {done.count('written')} written, {done.count('no-op')} no-op")
    # One write per edit. A controller's status update that slipped in between an edit and its repair arrives
    # after the repair, still showing the edit: it may cost one more apply, which the server finds a no-op.
    assert done.count("written") == len(edits) and done.count("no-op") <= len(edits), done

    # Repaired, the deployment is a steady state again: nothing is written, nothing even sent.
    def versions() -> dict[tuple[str, str], str]:
        return {key(o): o["metadata"]["resourceVersion"] for o in kube.children(op_namespace, name)}

    before = settled("the children after the repairs (the encoder scales back down)", versions)
    applies_before, log_at = applies(kube), operator.size()
    assert set(before) == set(by_key)
    time.sleep(QUIET_S)
    assert versions() == before
    assert applies(kube) == applies_before
    assert repairs(operator, log_at) == []
