"""The autoscaler of an autoscaled role: a KEDA ScaledObject (Prometheus triggers) or an autoscaling/v2 HPA.

Each named signal becomes a PromQL query over the deployment's own pods, selected by the labels the chart's
PodMonitor copies onto every series (`PROMETHEUS_LABELS`). The workload itself is rendered without replicas
(render.objects), so the HPA that either autoscaler drives is the only writer of that field.
"""

from __future__ import annotations

import re
from typing import Any, Final

from epd_connectors.config.roles import Role
from epd_operator.api import constants as c
from epd_operator.api.autoscaling import PER_REPLICA_SIGNALS, AutoscalingSpec, ScalingPolicy, ScalingSignal
from epd_operator.render import meta
from epd_operator.render.context import Context, Unit

SCALED_OBJECT_API: Final = "keda.sh/v1alpha1"
HPA_API: Final = "autoscaling/v2"


def prometheus_label(label: str) -> str:
    """A pod label as Prometheus names it once a PodMonitor's podTargetLabels copies it (invalid characters
    become underscores)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", label)


PROMETHEUS_LABELS: Final = (c.LABEL_DEPLOYMENT, c.LABEL_ROLE, c.LABEL_POOL)
"""The pod labels the chart's PodMonitor copies onto every series (podTargetLabels); the queries select on them."""

DEFAULT_SIGNALS: Final[dict[Role, tuple[ScalingSignal, ...]]] = {
    Role.ENCODER: (ScalingSignal(signal="inFlight", target=4),),
    Role.PREFILL: (ScalingSignal(signal="waiting", target=2),),
    Role.DECODE: (ScalingSignal(signal="running", target=32), ScalingSignal(signal="kvCacheUsage", target=0.8)),
    Role.PD: (ScalingSignal(signal="running", target=32), ScalingSignal(signal="kvCacheUsage", target=0.8)),
}
"""What a role scales on when its autoscaling names no signals: an encoder on the work the proxy has at it, a
prefill on its queue, a decode on its batch and its KV cache."""

_VLLM_SERIES: Final = {
    "waiting": "vllm:num_requests_waiting",
    "running": "vllm:num_requests_running",
    "kvCacheUsage": "vllm:kv_cache_usage_perc",
}
TTFT_QUANTILE: Final = 0.9
TTFT_WINDOW: Final = "1m"
IN_FLIGHT_WINDOW: Final = "30s"
"""inFlight is averaged over this window: the proxy's gauge is an instant count, and an HPA reading it every
15 s would see a busy role idle between two requests and scale it down under load."""


def signals(unit: Unit, spec: AutoscalingSpec) -> tuple[ScalingSignal, ...]:
    """The signals `unit` scales on: the spec's, else its role's default."""
    return tuple(spec.signals) or DEFAULT_SIGNALS[unit.role]


def _matchers(labels: dict[str, str]) -> str:
    return ", ".join(f'{name}="{value}"' for name, value in labels.items())


def _pod_labels(ctx: Context, unit: Unit, role: Role) -> dict[str, str]:
    labels = {"namespace": ctx.owner.namespace, prometheus_label(c.LABEL_DEPLOYMENT): ctx.owner.name}
    labels[prometheus_label(c.LABEL_ROLE)] = role.value
    if role == unit.role and unit.pool is not None:
        labels[prometheus_label(c.LABEL_POOL)] = unit.pool
    return labels


def _series_labels(ctx: Context, unit: Unit, signal: ScalingSignal) -> dict[str, str]:
    """The labels that pick the signal's series: the proxy's for inFlight (its gauge is labelled with the
    backend role, not its pool), the unit's own pods' otherwise (a raw query: the deployment's)."""
    if signal.signal == "inFlight":
        return {**_pod_labels(ctx, unit, Role.PROXY), "role": unit.role.value}
    if signal.signal == "query":
        return {"namespace": ctx.owner.namespace, prometheus_label(c.LABEL_DEPLOYMENT): ctx.owner.name}
    return _pod_labels(ctx, unit, unit.role)


def promql(ctx: Context, unit: Unit, signal: ScalingSignal) -> str:
    """The signal as one PromQL expression over this deployment's pods."""
    if signal.signal == "query":
        assert signal.query is not None  # the model's rule
        return signal.query
    own = _matchers(_series_labels(ctx, unit, signal))
    if signal.signal == "inFlight":
        in_flight = f"sum(avg_over_time(epd_proxy_backend_in_flight{{{own}}}[{IN_FLIGHT_WINDOW}]))"
        if unit.role == Role.ENCODER:  # at zero encoders the media requests the proxy holds wake them, at once
            return f"{in_flight} + sum(epd_proxy_requests_waiting{{{own}}})"
        return in_flight
    if signal.signal == "kvCacheUsage":
        return f"avg({_VLLM_SERIES['kvCacheUsage']}{{{own}}})"
    if signal.signal == "timeToFirstToken":
        rate = f"rate(vllm:time_to_first_token_seconds_bucket{{{own}}}[{TTFT_WINDOW}])"
        return f"histogram_quantile({TTFT_QUANTILE}, sum by (le) ({rate}))"
    return f"sum({_VLLM_SERIES[signal.signal]}{{{own}}})"


def per_replica(signal: ScalingSignal) -> bool:
    """Whether the target is per replica (the HPA's AverageValue) rather than the signal's own value (Value)."""
    return signal.per_replica if signal.signal == "query" else signal.signal in PER_REPLICA_SIGNALS


def quantity(value: float) -> str:
    """A target as a Kubernetes quantity: whole numbers as they are, others in thousandths (0.8 -> 800m)."""
    return str(int(value)) if value == int(value) else f"{round(value * 1000)}m"


def _behavior(spec: AutoscalingSpec) -> dict[str, Any]:
    def rules(policy: ScalingPolicy) -> dict[str, Any]:
        step = {"type": "Pods", "value": policy.max_replicas_per_step, "periodSeconds": policy.period_seconds}
        return {"stabilizationWindowSeconds": policy.stabilization_seconds, "policies": [step]}

    return {"scaleUp": rules(spec.scale_up), "scaleDown": rules(spec.scale_down)}


def _target(unit: Unit, workload_kind: str) -> dict[str, str]:
    return {"apiVersion": "apps/v1", "kind": workload_kind, "name": unit.name}


def _cooldown(spec: AutoscalingSpec) -> dict[str, int]:
    """KEDA's own scale-down to 0 (the HPA stops at 1) waits `cooldownPeriod` after the role was last active
    (300 s unless set): the role's scale-down window, so both steps down follow the one setting."""
    return {"cooldownPeriod": spec.scale_down.stabilization_seconds} if spec.min_replicas == 0 else {}


def render_scaled_object(ctx: Context, unit: Unit, spec: AutoscalingSpec, prometheus_url: str) -> dict[str, Any]:
    """A KEDA ScaledObject: one Prometheus trigger per signal; KEDA makes the HPA (keda-hpa-<name>)."""
    triggers = [
        {
            "type": "prometheus",
            "name": f"{s.signal.lower()}-{i}",
            "metricType": "AverageValue" if per_replica(s) else "Value",
            "metadata": {"serverAddress": prometheus_url, "query": promql(ctx, unit, s), "threshold": f"{s.target:g}"},
        }
        for i, s in enumerate(signals(unit, spec))
    ]
    return {
        "apiVersion": SCALED_OBJECT_API,
        "kind": "ScaledObject",
        "metadata": meta.metadata(ctx.owner, unit.name, unit.role, unit.pool),
        "spec": {
            "scaleTargetRef": _target(unit, "Deployment"),
            "pollingInterval": spec.polling_seconds,
            "minReplicaCount": spec.min_replicas,
            **_cooldown(spec),
            "maxReplicaCount": spec.max_replicas,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(spec)}},
            "triggers": triggers,
        },
    }


def _hpa_metric(ctx: Context, unit: Unit, signal: ScalingSignal) -> dict[str, Any]:
    assert signal.adapter_metric is not None  # the model's rule
    value = quantity(signal.target)
    if signal.signal in _VLLM_SERIES:  # a per-pod series: the HPA reads the workload's own pods
        target = {"type": "AverageValue", "averageValue": value}
        return {"type": "Pods", "pods": {"metric": {"name": signal.adapter_metric}, "target": target}}
    kind = {"type": "AverageValue", "averageValue": value} if per_replica(signal) else {"type": "Value", "value": value}
    selector = {"matchLabels": {k: v for k, v in _series_labels(ctx, unit, signal).items() if k != "namespace"}}
    return {
        "type": "External",
        "external": {"metric": {"name": signal.adapter_metric, "selector": selector}, "target": kind},
    }


def render_hpa(ctx: Context, unit: Unit, spec: AutoscalingSpec) -> dict[str, Any]:
    """A plain autoscaling/v2 HPA on metrics the cluster's adapter serves (engine: hpa)."""
    return {
        "apiVersion": HPA_API,
        "kind": "HorizontalPodAutoscaler",
        "metadata": meta.metadata(ctx.owner, unit.name, unit.role, unit.pool),
        "spec": {
            "scaleTargetRef": _target(unit, "Deployment"),
            "minReplicas": spec.min_replicas,
            "maxReplicas": spec.max_replicas,
            "metrics": [_hpa_metric(ctx, unit, s) for s in signals(unit, spec)],
            "behavior": _behavior(spec),
        },
    }


def autoscaler_kind(spec: AutoscalingSpec | None) -> str | None:
    """The kind `render_autoscaler` makes for `spec`."""
    if spec is None:
        return None
    return "HorizontalPodAutoscaler" if spec.engine == "hpa" else "ScaledObject"


def render_autoscaler(ctx: Context, unit: Unit) -> dict[str, Any] | None:
    """The unit's autoscaler; None when it is not autoscaled. A KEDA one needs the operator's Prometheus
    (rules.autoscaling_problems refuses the spec before this runs without it)."""
    spec = unit.autoscaling
    if spec is None:
        return None
    if spec.engine == "hpa":
        return render_hpa(ctx, unit, spec)
    assert ctx.defaults.prometheus_url is not None
    return render_scaled_object(ctx, unit, spec, ctx.defaults.prometheus_url)
