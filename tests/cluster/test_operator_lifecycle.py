"""The operator against a real control plane: examples become Ready, invalid specs are refused or reported,
changes roll only what changed, deletion collects everything, and a steady state writes nothing.

One operator process serves the whole module; each test has its own namespace. Expected children always come
from the real render of the same spec, so these tests check the operator's I/O, not render's choices.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes.utils import parse_quantity

from epd_connectors.config.roles import VLLM_ROLES
from epd_operator.api import constants as c
from epd_operator.api.resource import OperatorDefaults, Owner, parse_spec
from epd_operator.render import Desired, RoleWorkload, render_desired
from tests.cluster.operator_fixtures import (
    EPD_PATH,
    EXAMPLES,
    PROMETHEUS_URL,
    ApiError,
    Kube,
    Operator,
    claims,
    condition,
    eventually,
    example,
    key,
    provide_claim,
    settled,
)

pytestmark = pytest.mark.cluster
pytest_plugins = ["tests.cluster.operator_fixtures"]

OFFLOAD = next(p for p in EXAMPLES if p.name == "e-p-d-store-offload.yaml")
CROSS_ENCODER = next(p for p in EXAMPLES if p.name == "e-pd-mooncake-cross-encoder.yaml")


def rendered(kube: Kube, ns: str, name: str) -> Desired:
    """What the operator should have made of the object as it is now."""
    live = kube.epd(ns, name)
    meta = live["metadata"]
    owner = Owner(meta["name"], meta["namespace"], meta["uid"], meta["generation"])
    return render_desired(owner, parse_spec(live["spec"]), OperatorDefaults(prometheus_url=PROMETHEUS_URL))


def create(kube: Kube, doc: dict[str, Any]) -> dict[str, Any]:
    for claim in claims(doc):
        provide_claim(kube, doc["metadata"]["namespace"], claim)
    created: dict[str, Any] = kube.request("POST", EPD_PATH.format(ns=doc["metadata"]["namespace"]), doc)
    return created


def ready(kube: Kube, ns: str, name: str, generation: int | None = None) -> dict[str, Any]:
    """The EPDDeployment once Ready at its current (or the given) generation."""

    def probe() -> dict[str, Any] | None:
        live = kube.epd(ns, name)
        want = generation or live["metadata"]["generation"]
        st = live.get("status") or {}
        if st.get("observedGeneration") == want and condition(live, c.COND_READY).get("status") == "True":
            return live
        return None

    def detail() -> str:
        st = kube.epd(ns, name).get("status") or {}
        lines = [f"{x['type']}={x['status']} {x['reason']}: {x['message']}" for x in st.get("conditions") or []]
        pods = kube.items(f"/api/v1/namespaces/{ns}/pods")
        lines += [
            f"pod {p['metadata']['name']}: {p['status'].get('phase')} {p['status'].get('conditions')}" for p in pods
        ]
        return "\n".join([f"observedGeneration={st.get('observedGeneration')}", *lines])

    return eventually(f"{ns}/{name} Ready", probe, detail=detail)


def versions(kube: Kube, ns: str, name: str) -> dict[tuple[str, str], str]:
    """Each child's generation where it has one (spec changes only), else its resourceVersion."""
    return {
        key(o): f"g{o['metadata']['generation']}" if "generation" in o["metadata"] else o["metadata"]["resourceVersion"]
        for o in kube.children(ns, name)
    }


def mismatches(live: Any, want: Any, path: str = "") -> list[str]:
    """Where `live` lacks or differs from `want` (the server adds defaults, so extra live fields are fine)."""
    if isinstance(want, dict):
        if not isinstance(live, dict):
            return [f"{path}: {live!r} is not an object"]
        return [m for k, v in want.items() for m in mismatches(live.get(k), v, f"{path}.{k}")]
    if isinstance(want, list):
        if not isinstance(live, list) or len(live) != len(want):
            return [f"{path}: {live!r} != {want!r}"]
        return [
            m for i, (lv, wv) in enumerate(zip(live, want, strict=True)) for m in mismatches(lv, wv, f"{path}[{i}]")
        ]
    if live == want:
        return []
    try:  # the server writes quantities canonically ("68719476736" -> "64Gi")
        if parse_quantity(live) == parse_quantity(want):  # type: ignore[no-untyped-call]
            return []
    except (ValueError, TypeError):
        pass
    return [f"{path}: {live!r} != {want!r}"]


def _single_prefill(desired: Any) -> bool:
    return sum(w.replicas or 0 for w in desired.workloads if w.role == "prefill") == 1


# -- tests


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_gets_every_child_and_becomes_ready(
    operator: Operator, kube: Kube, op_namespace: str, path: Any
) -> None:
    doc = example(path, op_namespace)
    name = doc["metadata"]["name"]
    began = time.monotonic()
    create(kube, doc)
    want = rendered(kube, op_namespace, name)
    wanted = {key(o) for o in want.objects}
    eventually("every child", lambda: wanted <= {key(o) for o in kube.children(op_namespace, name)})
    created_s = time.monotonic() - began

    live = {key(o): o for o in kube.children(op_namespace, name)}
    assert set(live) == wanted, "no child beyond the rendered ones"
    for obj in want.objects:
        assert mismatches(live[key(obj)], obj) == [], key(obj)

    done = ready(kube, op_namespace, name)
    st = done["status"]
    print(f"{path.stem}: children {created_s:.2f} s, Ready {time.monotonic() - began:.2f} s")
    assert st["phase"] == "Ready"
    assert [x["type"] for x in st["conditions"]] == list(c.CONDITION_TYPES)
    waiting = {c.COND_REDUNDANT, c.COND_AUTOSCALING}
    assert all(x["status"] == "True" for x in st["conditions"] if x["type"] not in waiting)
    # No KEDA runs here: a ScaledObject (accepted by KEDA's CRD) never reports; nothing autoscaled is True.
    (scaling,) = [x for x in st["conditions"] if x["type"] == c.COND_AUTOSCALING]
    autoscaled = any(w.autoscaled for w in want.workloads)
    assert (scaling["status"], scaling["reason"]) == (
        ("Unknown", "AutoscalerNotReporting") if autoscaled else ("True", "NotAutoscaled")
    ), scaling
    (redundant,) = [x for x in st["conditions"] if x["type"] == c.COND_REDUNDANT]
    counts = {w.role.value: at_rest(w) for w in want.workloads}
    single = {role for role, count in counts.items() if count == 1} & {"encoder", "decode", "pd", "proxy"}
    assert (redundant["status"] == "True") == (not single and not _single_prefill(want)), redundant
    assert st["endpoint"] == want.derived.endpoint and st["tenantId"] == want.derived.tenant_id
    assert (st["embeddingCachePrefix"], st["kvCachePrefix"], st["storeTpSize"]) == (
        want.derived.embedding_cache_prefix,
        want.derived.kv_cache_prefix,
        want.derived.store_tp_size,
    )
    for role in ("encoder", "prefill", "decode", "pd", "proxy"):
        replicas = sum(at_rest(w) for w in want.workloads if w.role == role)
        if any(w.role == role for w in want.workloads):
            assert st["rolesReady"][role] == f"{replicas}/{replicas}"
    assert not done["metadata"].get("finalizers"), "children go by garbage collection; no finalizer needed"
    assert st["modelRevision"] == want.derived.model_revision
    # The simulated node leaves the revision gate alone (kwok-stages.yaml): the operator opened each one.
    eventually("every model pod's revision gate open", lambda: gates(kube, op_namespace, name) == model_pods(want))


def model_pods(desired: Desired) -> dict[str, str]:
    """Role -> "True" for each model role with replicas (what `gates` gives once every gate is open)."""
    return {w.role.value: "True" for w in desired.workloads if w.role in VLLM_ROLES and at_rest(w) > 0}


def at_rest(workload: RoleWorkload) -> int:
    """The replicas a workload runs here: the spec's, or for an autoscaled one the API server's default (1), as
    no KEDA runs to scale it."""
    return 1 if workload.autoscaled else workload.replicas or 0


def gates(kube: Kube, namespace: str, name: str) -> dict[str, str]:
    """Role -> the revision gate's status over that role's pods ("True" only if open on all), for the pods that
    have the gate; "missing" where a pod lacks the condition."""
    found: dict[str, str] = {}
    for pod in kube.items(f"/api/v1/namespaces/{namespace}/pods?labelSelector={c.LABEL_DEPLOYMENT}={name}"):
        if not any(g["conditionType"] == c.CONDITION_REVISION_READY for g in pod["spec"].get("readinessGates") or []):
            continue
        conditions = {x["type"]: x["status"] for x in pod["status"].get("conditions") or []}
        status = conditions.get(c.CONDITION_REVISION_READY, "missing")
        role = pod["metadata"]["labels"][c.LABEL_ROLE]
        found[role] = status if found.get(role, "True") == "True" else found[role]
    return found


def test_api_server_refuses_what_cel_rules_forbid(operator: Operator, kube: Kube, op_namespace: str) -> None:
    doc = example(CROSS_ENCODER, op_namespace)
    del doc["spec"]["store"]  # cross-encoder reuse without a store
    with pytest.raises(ApiError) as refused:
        kube.request("POST", EPD_PATH.format(ns=op_namespace), doc)
    assert refused.value.status == 422
    assert "cross-encoder reuse needs a Mooncake store; add spec.store" in refused.value.body["message"]
    assert kube.items(EPD_PATH.format(ns=op_namespace)) == []


def test_spec_the_crd_accepts_but_render_refuses_sets_valid_false(
    operator: Operator, kube: Kube, op_namespace: str
) -> None:
    doc = example(CROSS_ENCODER, op_namespace)
    doc["spec"]["model"]["mmProcessorCacheGB"] = 0  # reuse needs the processor cache; no CEL rule says so
    create(kube, doc)
    name = doc["metadata"]["name"]

    def invalid() -> dict[str, Any] | None:
        live = kube.epd(op_namespace, name)
        return live if condition(live, c.COND_VALID).get("status") == "False" else None

    live = eventually("Valid=False", invalid)
    valid = condition(live, c.COND_VALID)
    assert valid["reason"] == "InvalidSpec" and "spec.model.mmProcessorCacheGB" in valid["message"]
    assert live["status"]["phase"] == "Invalid" and live["status"]["observedGeneration"] == 1
    time.sleep(1.0)
    assert kube.children(op_namespace, name) == []
    events = kube.items(f"/api/v1/namespaces/{op_namespace}/events?fieldSelector=involvedObject.name={name}")
    assert any(e["reason"] == "InvalidSpec" and e["type"] == "Warning" for e in events)


def test_invalid_change_leaves_the_running_children_untouched(
    operator: Operator, kube: Kube, op_namespace: str
) -> None:
    doc = example(CROSS_ENCODER, op_namespace)
    create(kube, doc)
    name = doc["metadata"]["name"]
    ready(kube, op_namespace, name)
    before = versions(kube, op_namespace, name)
    path = EPD_PATH.format(ns=op_namespace) + f"/{name}"

    kube.merge_patch(path, {"spec": {"model": {"mmProcessorCacheGB": 0}}})

    def reported() -> dict[str, Any] | None:
        live = kube.epd(op_namespace, name)
        ok = live["status"]["observedGeneration"] == 2 and condition(live, c.COND_VALID).get("status") == "False"
        return live if ok else None

    live = eventually("Valid=False at generation 2", reported)
    assert live["status"]["phase"] == "Invalid"
    assert condition(live, c.COND_DECODE_READY)["status"] == "True", "the running children are still reported"
    time.sleep(1.0)
    assert versions(kube, op_namespace, name) == before

    kube.merge_patch(path, {"spec": {"model": {"mmProcessorCacheGB": 4}}})
    fixed = ready(kube, op_namespace, name, generation=3)
    assert condition(fixed, c.COND_VALID)["status"] == "True"
    assert versions(kube, op_namespace, name) == before, "back to the same spec: nothing to write"


def test_new_model_revision_changes_prefixes_labels_and_rolls_only_changed_roles(
    operator: Operator, kube: Kube, op_namespace: str
) -> None:
    doc = example(CROSS_ENCODER, op_namespace)
    create(kube, doc)
    name = doc["metadata"]["name"]
    old = ready(kube, op_namespace, name)["status"]
    old_render = rendered(kube, op_namespace, name)
    before = versions(kube, op_namespace, name)

    kube.merge_patch(EPD_PATH.format(ns=op_namespace) + f"/{name}", {"spec": {"model": {"revision": "v2-new"}}})
    new = ready(kube, op_namespace, name, generation=2)["status"]
    new_render = rendered(kube, op_namespace, name)
    assert new["embeddingCachePrefix"] != old["embeddingCachePrefix"]
    assert new["kvCachePrefix"] != old["kvCachePrefix"]
    assert new["embeddingCachePrefix"] == new_render.derived.embedding_cache_prefix

    def template_hash(desired: Desired, workload: str) -> str:
        obj = next(
            o
            for o in desired.objects
            if o["metadata"]["name"] == workload and o["kind"] in ("Deployment", "StatefulSet", "DaemonSet")
        )
        annotations: dict[str, str] = obj["spec"]["template"]["metadata"].get("annotations") or {}
        return annotations.get(c.ANNOTATION_BUNDLE_HASH, "")

    should_roll = {
        (w.kind, w.name)
        for w in new_render.workloads
        if template_hash(new_render, w.name) != template_hash(old_render, w.name)
    }
    after = versions(kube, op_namespace, name)
    rolled = {k for k in before if k[0] in ("Deployment", "StatefulSet", "DaemonSet") and before[k] != after[k]}
    assert should_roll, "a new revision changes some bundle"
    assert rolled == should_roll
    assert (("Deployment", f"{name}-master")) not in rolled
    assert new["modelRevision"] != old["modelRevision"]
    eventually("the new revision's pods' gates open", lambda: gates(kube, op_namespace, name) == model_pods(new_render))
    for workload in kube.children(op_namespace, name, kinds=(("apps/v1", "deployments"), ("apps/v1", "statefulsets"))):
        template = workload["spec"]["template"]["metadata"]
        assert (template.get("annotations") or {}).get(c.ANNOTATION_BUNDLE_HASH) == template_hash(
            new_render, workload["metadata"]["name"]
        )
        vllm = template["labels"][c.LABEL_ROLE] in VLLM_ROLES
        assert template["labels"].get(c.LABEL_MODEL_REVISION) == (new["modelRevision"] if vllm else None)


def test_scaling_encoders_changes_only_the_encoder_deployment(
    operator: Operator, kube: Kube, op_namespace: str
) -> None:
    doc = example(OFFLOAD, op_namespace)
    doc["spec"]["encoder"]["replicas"] = 1
    create(kube, doc)
    name = doc["metadata"]["name"]
    ready(kube, op_namespace, name)
    before = versions(kube, op_namespace, name)

    kube.merge_patch(EPD_PATH.format(ns=op_namespace) + f"/{name}", {"spec": {"encoder": {"replicas": 3}}})
    live = ready(kube, op_namespace, name, generation=2)
    assert live["status"]["rolesReady"]["encoder"] == "3/3"
    after = versions(kube, op_namespace, name)
    assert {k for k in before if before[k] != after.get(k)} == {("Deployment", f"{name}-encoder")}
    assert set(after) == set(before)


def test_removing_prefill_gives_combined_pd(operator: Operator, kube: Kube, op_namespace: str) -> None:
    doc = example(OFFLOAD, op_namespace)
    create(kube, doc)
    name = doc["metadata"]["name"]
    ready(kube, op_namespace, name)
    epd = {key(o) for o in rendered(kube, op_namespace, name).objects}

    kube.merge_patch(EPD_PATH.format(ns=op_namespace) + f"/{name}", {"spec": {"prefill": None, "decode": {"kv": None}}})
    live = ready(kube, op_namespace, name, generation=2)
    pd = {key(o) for o in rendered(kube, op_namespace, name).objects}
    eventually("exactly the PD children", lambda: {key(o) for o in kube.children(op_namespace, name)} == pd)
    gone = epd - pd
    assert ("Deployment", f"{name}-prefill") in gone and ("Deployment", f"{name}-prefill-tp2") in gone
    assert ("Deployment", f"{name}-pd") in pd
    assert not any(n.startswith(f"{name}-prefill") for _, n in pd)
    st = live["status"]
    assert "pd" in st["roles"] and "prefill" not in st["roles"] and "decode" not in st["roles"]
    assert set(st["rolesReady"]) == {"encoder", "pd", "store", "proxy"}
    assert condition(live, c.COND_PREFILL_READY)["reason"] == "NotRequired"


def test_deleted_workload_is_recreated(operator: Operator, kube: Kube, op_namespace: str) -> None:
    doc = example(OFFLOAD, op_namespace)
    create(kube, doc)
    name = doc["metadata"]["name"]
    ready(kube, op_namespace, name)
    path = f"/apis/apps/v1/namespaces/{op_namespace}/deployments/{name}-encoder"
    uid = kube.get(path)["metadata"]["uid"]
    kube.delete(path)
    eventually(
        "a new encoder Deployment", lambda: (kube.find(path) or {}).get("metadata", {}).get("uid") not in (None, uid)
    )
    ready(kube, op_namespace, name)


def test_delete_collects_every_child(operator: Operator, kube: Kube, op_namespace: str) -> None:
    doc = example(OFFLOAD, op_namespace)
    create(kube, doc)
    name = doc["metadata"]["name"]
    eventually(
        "children", lambda: len(kube.children(op_namespace, name)) >= len(rendered(kube, op_namespace, name).objects)
    )
    kube.request("DELETE", EPD_PATH.format(ns=op_namespace) + f"/{name}")
    eventually("every child gone", lambda: kube.children(op_namespace, name) == [])
    selector = f"{c.LABEL_DEPLOYMENT}={name}"
    eventually(
        "every pod gone", lambda: kube.items(f"/api/v1/namespaces/{op_namespace}/pods?labelSelector={selector}") == []
    )


def test_unchanged_resource_writes_nothing_for_a_minute(operator: Operator, kube: Kube, op_namespace: str) -> None:
    doc = example(OFFLOAD, op_namespace)
    create(kube, doc)
    name = doc["metadata"]["name"]
    ready(kube, op_namespace, name)

    def snapshot() -> dict[tuple[str, str], str]:
        found = {key(o): o["metadata"]["resourceVersion"] for o in kube.children(op_namespace, name)}
        found[(c.KIND, name)] = kube.epd(op_namespace, name)["metadata"]["resourceVersion"]
        return found

    before, metrics_before = settled("every child and the EPDDeployment", snapshot), operator.metrics()
    time.sleep(60.0)
    after, metrics_after = snapshot(), operator.metrics()
    assert after == before
    for sample in ("epd_operator_status_writes_total", 'epd_operator_reconciles_total{outcome="changed"}'):
        assert metrics_after.get(sample) == metrics_before.get(sample), sample


def test_metrics_and_liveness(operator: Operator, kube: Kube, op_namespace: str) -> None:
    doc = example(OFFLOAD, op_namespace, name="metered")
    create(kube, doc)
    ready(kube, op_namespace, "metered")

    def counted_ready() -> dict[str, float] | None:
        samples = operator.metrics()
        return samples if samples['epd_operator_deployments{phase="Ready"}'] >= 1 else None

    # The operator sets the phase gauge when its status write returns; the test's watch can see Ready before.
    samples = eventually("the Ready phase counted in the gauge", counted_ready, timeout=10.0)
    assert samples['epd_operator_reconciles_total{outcome="changed"}'] >= 1
    assert samples["epd_operator_reconcile_duration_seconds_count"] >= 1
    assert samples['epd_operator_managed_objects{kind="Deployment"}'] >= 6
    assert operator.alive()
