"""spec.<role>.autoscaling: what render makes of it (the autoscaler, the workload without replicas), what it
refuses (naming the field and the fix), how the operator lets go of replicas it owned, and the Autoscaling
condition from what the autoscalers report."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from epd_connectors.config.roles import Role
from epd_operator import apply, autoscalers, managed_fields, status
from epd_operator.api import constants as c
from epd_operator.api.resource import InvalidSpecError, OperatorDefaults, Owner, parse_spec
from epd_operator.render import Desired, RoleWorkload, render_desired
from epd_operator.revision_gate import model_roles
from tests.unit.operator.bundles import bundles_of

pytestmark = pytest.mark.unit

OWNER = Owner(name="demo", namespace="serving", uid="00000000-0000-4000-8000-000000000003")
PROMETHEUS = "http://prometheus.monitoring.svc:9090"
DEFAULTS = OperatorDefaults(prometheus_url=PROMETHEUS)
MODEL = {"name": "Qwen/Qwen2-VL-2B-Instruct", "source": {"pvc": {"claimName": "weights"}}}


def spec(**roles: Any) -> dict[str, Any]:
    return {"model": MODEL, "encoder": {"connector": "mooncake"}, **roles}


def render(raw: dict[str, Any], defaults: OperatorDefaults = DEFAULTS) -> Desired:
    return render_desired(OWNER, parse_spec(raw), defaults)


def one(desired: Desired, kind: str, name: str) -> dict[str, Any]:
    return next(o for o in desired.objects if o["kind"] == kind and o["metadata"]["name"] == name)


def kinds(desired: Desired, kind: str) -> list[str]:
    return [o["metadata"]["name"] for o in desired.objects if o["kind"] == kind]


def refused(raw: dict[str, Any], defaults: OperatorDefaults = DEFAULTS) -> str:
    with pytest.raises(InvalidSpecError) as caught:
        render(raw, defaults)
    return "\n".join(caught.value.problems)


def scaled_decode(**autoscaling: Any) -> dict[str, Any]:
    return {"decode": {"autoscaling": {"maxReplicas": 2, **autoscaling}}}


SCALED_ENCODER = {"connector": "mooncake", "autoscaling": {"minReplicas": 1, "maxReplicas": 4}}


def test_an_autoscaled_role_gets_a_scaled_object_and_a_workload_without_replicas() -> None:
    desired = render(spec(encoder=SCALED_ENCODER, decode={"replicas": 2}))
    assert kinds(desired, "ScaledObject") == ["demo-encoder"]
    scaled = one(desired, "ScaledObject", "demo-encoder")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid
    assert scaled["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "demo-encoder"}
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (1, 4)
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["serverAddress"] == PROMETHEUS and trigger["metadata"]["threshold"] == "4"
    # The encoder's default signal: the proxy's outstanding requests at the encoders of this deployment only.
    query = trigger["metadata"]["query"]
    for matcher in (
        'namespace="serving"',
        'epd_serving_io_deployment="demo"',
        'epd_serving_io_role="proxy"',
        'role="encoder"',
    ):
        assert matcher in query
    # Averaged over 30 s: an instant count read every 15 s by the HPA would read a busy encoder as idle.
    assert query.startswith("sum(avg_over_time(epd_proxy_backend_in_flight{") and "}[30s])) + sum(" in query
    assert "cooldownPeriod" not in scaled["spec"]  # only KEDA's step to 0 waits on it
    assert "replicas" not in one(desired, "Deployment", "demo-encoder")["spec"]
    assert one(desired, "Deployment", "demo-pd")["spec"]["replicas"] == 2  # not autoscaled: as before
    encoder = next(w for w in desired.workloads if w.role == Role.ENCODER)
    assert (encoder.replicas, encoder.autoscaler, encoder.bounds) == (None, "ScaledObject", (1, 4))
    # Autoscaling on a role leaves every other object as it was.
    fixed = render(spec(encoder={"connector": "mooncake", "replicas": 3}, decode={"replicas": 2}))
    before = {(o["kind"], o["metadata"]["name"]): o for o in fixed.objects}
    after = {(o["kind"], o["metadata"]["name"]): o for o in desired.objects}
    assert set(after) - set(before) == {("ScaledObject", "demo-encoder")}
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {("Deployment", "demo-encoder")}
    without_replicas = copy.deepcopy(before["Deployment", "demo-encoder"])
    del without_replicas["spec"]["replicas"]
    assert after["Deployment", "demo-encoder"] == without_replicas


def test_every_role_has_a_default_signal_scoped_to_its_own_pods() -> None:
    raw = spec(
        encoder=SCALED_ENCODER,
        prefill={
            "kv": {"connector": "mooncake"},
            "autoscaling": {"maxReplicas": 3},
            "additionalPools": [{"name": "tp2", "tensorParallelSize": 2, "autoscaling": {"maxReplicas": 2}}],
        },
        decode={"autoscaling": {"maxReplicas": 5}},
    )
    desired = render(raw)
    assert kinds(desired, "ScaledObject") == ["demo-encoder", "demo-prefill", "demo-prefill-tp2", "demo-decode"]
    main = one(desired, "ScaledObject", "demo-prefill")["spec"]["triggers"]
    assert [t["metadata"]["query"] for t in main] == [
        'sum(vllm:num_requests_waiting{namespace="serving", epd_serving_io_deployment="demo", '
        'epd_serving_io_role="prefill", epd_serving_io_pool="main"})'
    ]
    pool = one(desired, "ScaledObject", "demo-prefill-tp2")["spec"]["triggers"][0]["metadata"]["query"]
    assert 'epd_serving_io_pool="tp2"' in pool
    decode = one(desired, "ScaledObject", "demo-decode")["spec"]["triggers"]
    assert [(t["metricType"], t["metadata"]["threshold"]) for t in decode] == [("AverageValue", "32"), ("Value", "0.8")]
    assert decode[1]["metadata"]["query"].startswith("avg(vllm:kv_cache_usage_perc{")
    assert all("replicas" not in o["spec"] for o in desired.objects if o["kind"] == "Deployment" and "proxy" not in
               o["metadata"]["name"])  # fmt: skip


def test_a_raw_query_and_time_to_first_token() -> None:
    signals = [
        {"signal": "query", "query": "sum(rate(my_requests_total[1m]))", "target": 10, "perReplica": False},
        {"signal": "timeToFirstToken", "target": 0.5},
    ]
    desired = render(spec(decode={"autoscaling": {"maxReplicas": 2, "signals": signals}}))
    triggers = one(desired, "ScaledObject", "demo-pd")["spec"]["triggers"]
    assert triggers[0]["metadata"]["query"] == "sum(rate(my_requests_total[1m]))"
    assert triggers[0]["metricType"] == "Value"
    assert triggers[1]["metadata"]["query"].startswith("histogram_quantile(0.9, sum by (le) (rate(")
    assert triggers[1]["metricType"] == "Value" and triggers[1]["metadata"]["threshold"] == "0.5"


def test_engine_hpa_renders_a_plain_hpa_on_the_adapters_metrics() -> None:
    signals = [
        {"signal": "running", "target": 24, "adapterMetric": "vllm_num_requests_running"},
        {"signal": "kvCacheUsage", "target": 0.75, "adapterMetric": "vllm_kv_cache_usage_perc"},
        {"signal": "inFlight", "target": 8, "adapterMetric": "epd_proxy_backend_in_flight"},
    ]
    scaling = {"engine": "hpa", "minReplicas": 2, "maxReplicas": 6, "signals": signals}
    desired = render(spec(decode={"autoscaling": scaling}), OperatorDefaults())  # no Prometheus needed
    assert kinds(desired, "ScaledObject") == []
    hpa = one(desired, "HorizontalPodAutoscaler", "demo-pd")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    running, kv, in_flight = hpa["spec"]["metrics"]
    assert running == {
        "type": "Pods",
        "pods": {
            "metric": {"name": "vllm_num_requests_running"},
            "target": {"type": "AverageValue", "averageValue": "24"},
        },
    }
    assert kv["pods"]["target"] == {"type": "AverageValue", "averageValue": "750m"}
    assert in_flight["type"] == "External"
    assert in_flight["external"]["metric"]["selector"]["matchLabels"] == {
        "epd_serving_io_deployment": "demo",
        "epd_serving_io_role": "proxy",
        "role": "pd",
    }
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
    assert next(w for w in desired.workloads if w.role == Role.PD).autoscaler == "HorizontalPodAutoscaler"


@pytest.mark.parametrize(
    ("roles", "defaults", "field", "fix"),
    [
        (
            {"encoder": {"autoscaling": {"minReplicas": 3, "maxReplicas": 2}}},
            DEFAULTS,
            "spec.encoder.autoscaling.minReplicas = 3",
            "give minReplicas <= maxReplicas",
        ),
        (
            {"decode": {"autoscaling": {"minReplicas": 0, "maxReplicas": 2}}},
            DEFAULTS,
            "spec.decode.autoscaling.minReplicas = 0",
            "give 1 or more",
        ),
        (
            scaled_decode(signals=[{"signal": "query", "target": 1}]),
            DEFAULTS,
            "spec.decode.autoscaling.signals[0].query = None",
            "give a PromQL query with signal: query",
        ),
        (
            scaled_decode(signals=[{"signal": "waiting", "target": 1, "query": "x"}]),
            DEFAULTS,
            "spec.decode.autoscaling.signals[0].query = 'x'",
            "none with another signal",
        ),
        (
            scaled_decode(engine="hpa", signals=[{"signal": "waiting", "target": 1}]),
            DEFAULTS,
            "spec.decode.autoscaling.signals = ['waiting']",
            "give each signal its adapterMetric",
        ),
        (
            {"decode": {"autoscaling": {"maxReplicas": 2}}},
            OperatorDefaults(),
            "spec.decode.autoscaling.engine = 'keda'",
            "autoscaling.prometheusUrl",
        ),
        (
            scaled_decode(signals=[{"signal": "waiting", "target": 0}]),
            DEFAULTS,
            "spec.decode.autoscaling.signals.0.target",
            "greater than 0",
        ),
    ],
    ids=["min-above-max", "decode-to-zero", "query-missing", "query-stray", "hpa-no-adapter",
         "keda-no-prometheus", "target-zero"],
)  # fmt: skip
def test_bad_autoscaling_is_refused_naming_the_field_and_the_fix(
    roles: dict[str, Any], defaults: OperatorDefaults, field: str, fix: str
) -> None:
    message = refused(spec(**roles), defaults)
    assert field in message and fix in message, message


def test_encoders_that_may_go_to_zero_are_held_for_by_the_proxy_and_woken_by_what_it_holds() -> None:
    scaling = {"minReplicas": 0, "maxReplicas": 3, "holdSeconds": 90}
    desired = render(spec(encoder={"connector": "mooncake", "autoscaling": scaling}))
    proxy = bundles_of(desired)["demo-proxy"].proxy
    assert proxy is not None and proxy.encoder_wake_s == 90.0
    query = one(desired, "ScaledObject", "demo-encoder")["spec"]["triggers"][0]["metadata"]["query"]
    # The requests held count at once (not averaged): the first one wakes an encoder.
    assert query.startswith("sum(avg_over_time(epd_proxy_backend_in_flight{")
    assert query.endswith('+ sum(epd_proxy_requests_waiting{namespace="serving", epd_serving_io_deployment="demo", '
                          'epd_serving_io_role="proxy", role="encoder"})')  # fmt: skip
    scaled = one(desired, "ScaledObject", "demo-encoder")["spec"]
    # KEDA's own step to 0 waits the role's scale-down window (the default 300 s), not KEDA's own default.
    assert (scaled["minReplicaCount"], scaled["cooldownPeriod"]) == (0, 300)
    # A set of a new model revision does not wait for encoders that may be at zero.
    assert "encoder" not in model_roles(desired.workloads)
    # Encoders that never go below 1 are required, and the proxy never holds a request for one.
    kept = render(spec(encoder=SCALED_ENCODER))
    assert bundles_of(kept)["demo-proxy"].proxy.encoder_wake_s == 0.0  # type: ignore[union-attr]
    assert "encoder" in model_roles(kept.workloads)


def test_letting_go_of_replicas_hands_them_over_only_when_we_own_them() -> None:
    desired = render(spec(encoder=SCALED_ENCODER)).objects
    workload = next(o for o in desired if o["kind"] == "Deployment" and o["metadata"]["name"] == "demo-encoder")
    ours = {
        "manager": c.FIELD_MANAGER,
        "operation": "Apply",
        "fieldsV1": {"f:spec": {"f:replicas": {}, "f:template": {}}},
    }
    scaler = {"manager": "kube-controller-manager", "operation": "Update", "subresource": "scale",
              "fieldsV1": {"f:spec": {"f:replicas": {}}}}  # fmt: skip
    live: dict[str, Any] = {**workload, "spec": {**workload["spec"], "replicas": 3}}
    live["metadata"] = {**workload["metadata"], "managedFields": [ours]}
    assert managed_fields.owns(live, apply.REPLICAS)
    assert apply.releases_replicas(workload, live)
    # Once the autoscaler holds them (our entry without replicas), nothing more is handed over.
    live["metadata"]["managedFields"] = [{**ours, "fieldsV1": {"f:spec": {"f:template": {}}}}, scaler]
    assert not managed_fields.owns(live, apply.REPLICAS)
    assert not apply.releases_replicas(workload, live)
    # A workload rendered with replicas never hands over.
    fixed = next(
        o for o in render(spec()).objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "demo-encoder"
    )
    live["metadata"]["managedFields"] = [ours]
    assert not apply.releases_replicas(fixed, live)


def test_an_autoscaled_model_role_still_counts_for_the_revision_gate() -> None:
    scaled = RoleWorkload(Role.ENCODER, "Deployment", "demo-encoder", None, autoscaler="ScaledObject", bounds=(1, 4))
    fixed = RoleWorkload(Role.PD, "Deployment", "demo-pd", 1)
    idle = RoleWorkload(Role.PREFILL, "Deployment", "demo-prefill", 0)
    assert model_roles([scaled, fixed, idle]) == {"encoder", "pd"}


def reading(kind: str, conditions: list[dict[str, str]] | None, replicas: int = 2) -> autoscalers.Reading:
    live = None if conditions is None else {"status": {"conditions": conditions}}
    return autoscalers.Reading("encoder", kind, "demo-encoder", live, replicas, 1, 4)


def test_the_autoscaling_condition_carries_the_autoscalers_own_reason() -> None:
    assert autoscalers.condition([]) == ("True", "NotAutoscaled", "no role is autoscaled")
    ok_hpa = [
        {"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale"},
        {"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound"},
    ]
    assert autoscalers.condition([reading("HorizontalPodAutoscaler", ok_hpa)]) == (
        "True",
        "Scaling",
        "every autoscaler can scale: encoder at 2 of 1-4",
    )
    failing = [
        ok_hpa[0],
        {
            "type": "ScalingActive",
            "status": "False",
            "reason": "FailedGetPodsMetric",
            "message": "unable to get metric vllm_num_requests_running",
        },
    ]
    state, reason, message = autoscalers.condition([reading("HorizontalPodAutoscaler", failing)])
    assert (state, reason) == ("False", "FailedGetPodsMetric")
    assert "encoder (HorizontalPodAutoscaler demo-encoder): ScalingActive False" in message
    assert "unable to get metric vllm_num_requests_running" in message
    # KEDA's ScaledObject: Ready False, or Fallback True, is a problem; at zero on purpose is not.
    keda_bad = [{"type": "Ready", "status": "False", "reason": "ScaledObjectCheckFailed", "message": "bad query"}]
    assert autoscalers.condition([reading("ScaledObject", keda_bad)])[:2] == ("False", "ScaledObjectCheckFailed")
    idle = [{"type": "AbleToScale", "status": "True"}, {"type": "ScalingActive", "status": "False",
                                                         "reason": "ScalingDisabled"}]  # fmt: skip
    assert autoscalers.condition([reading("HorizontalPodAutoscaler", idle, 0)])[0] == "True"
    assert autoscalers.condition([reading("ScaledObject", None)])[:2] == ("Unknown", "AutoscalerNotReporting")


def test_pods_an_autoscaler_is_adding_do_not_make_the_role_unready() -> None:
    scaled = RoleWorkload(Role.ENCODER, "Deployment", "demo-encoder", None, autoscaler="ScaledObject", bounds=(1, 4))
    fixed = RoleWorkload(Role.ENCODER, "Deployment", "demo-encoder", 3)
    # Scaling up from 1 to 3: one pod ready, two starting (same template, so all three count as updated).
    assert status.Observed(scaled, True, 3, 1, 3, 3, True).state[0]
    assert not status.Observed(fixed, True, 3, 1, 3, 3, True).state[0]
    # Below its floor it is unready like any role; at zero (a floor of 0 and nothing asked) it is ready.
    assert not status.Observed(scaled, True, 3, 0, 3, 3, True).state[0]
    at_zero = RoleWorkload(Role.ENCODER, "Deployment", "demo-encoder", None, autoscaler="ScaledObject", bounds=(0, 4))
    assert status.Observed(at_zero, True, 0, 0, 0, 0, True).state[0]
