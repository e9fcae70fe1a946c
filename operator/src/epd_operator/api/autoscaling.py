"""The `autoscaling` block of a role (and of a prefill pool): bounds, signals, behaviour, and which autoscaler.

The signals are named so that a user need not read Prometheus: render turns each into a PromQL query scoped to
the deployment's pods (render.autoscaling). A raw query is the escape hatch.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from epd_operator.api import kube as k
from epd_operator.api._base import ApiModel
from epd_operator.api._rules import Rule, RuledModel

Signal = Literal["inFlight", "waiting", "running", "kvCacheUsage", "timeToFirstToken", "query"]
"""inFlight: requests the proxy has outstanding at the role's instances (epd_proxy_backend_in_flight; for
encoders also the media requests it holds while they are at zero, epd_proxy_requests_waiting), per replica;
waiting / running: vLLM's own queue and batch (vllm:num_requests_waiting / _running), per replica;
kvCacheUsage: the role's mean KV cache use, 0 to 1 (vllm:kv_cache_usage_perc); timeToFirstToken: the 90th
percentile over the last minute, seconds (vllm:time_to_first_token_seconds); query: `query` as written."""

PER_REPLICA_SIGNALS: frozenset[str] = frozenset({"inFlight", "waiting", "running"})
"""Signals summed over the role and divided by its replicas (the HPA's AverageValue); the others are compared
as they are (Value)."""


class ScalingSignal(RuledModel):
    """One signal the role scales on; with several, the autoscaler follows the one asking for the most replicas."""

    RULES: ClassVar[tuple[Rule[ScalingSignal], ...]] = (
        Rule(
            ".query",
            lambda s: (s.signal == "query") == (s.query is not None),
            lambda s: s.query,
            "is the query of signal 'query', and only of it",
            "give a PromQL query with signal: query, and none with another signal",
            cel="(self.signal == 'query') == has(self.query)",
        ),
    )

    signal: Signal
    """What is measured (see the signal list in docs/autoscaling.md)."""
    target: float = Field(gt=0, le=1e9)
    """The value the autoscaler keeps the signal at: per replica for inFlight, waiting and running (and a query
    with perReplica), else the signal itself (kvCacheUsage 0.8, timeToFirstToken in seconds)."""
    query: str | None = Field(default=None, min_length=1, max_length=k.STRING_MAX)
    """signal: query only: a PromQL expression giving one number."""
    per_replica: bool = True
    """signal: query only: the query's value is divided by the replicas (AverageValue) rather than compared as
    it is (Value)."""
    adapter_metric: str | None = Field(default=None, min_length=1, max_length=253, pattern=r"^[A-Za-z_:][\w:.-]*$")
    """engine: hpa only: the name under which the cluster's metrics adapter serves this signal (a Pods metric
    for waiting, running and kvCacheUsage, an External metric otherwise)."""


_WINDOW = "The autoscaler acts on the most cautious recommendation of this many seconds (damps flapping)."
_STEP = "At most this many replicas added or removed per period."
_PERIOD = "The period of the step limit, in seconds."


class ScaleUpPolicy(ApiModel):
    """How fast replicas are added (an HPA behavior rule): by default at once, up to 2 every 30 s."""

    stabilization_seconds: int = Field(default=0, ge=0, le=3600, description=_WINDOW)
    max_replicas_per_step: int = Field(default=2, ge=1, le=k.REPLICAS_MAX, description=_STEP)
    period_seconds: int = Field(default=30, ge=1, le=1800, description=_PERIOD)


class ScaleDownPolicy(ApiModel):
    """How fast replicas are removed: by default after 5 minutes of less load, 1 a minute."""

    stabilization_seconds: int = Field(default=300, ge=0, le=3600, description=_WINDOW)
    max_replicas_per_step: int = Field(default=1, ge=1, le=k.REPLICAS_MAX, description=_STEP)
    period_seconds: int = Field(default=60, ge=1, le=1800, description=_PERIOD)


ScalingPolicy = ScaleUpPolicy | ScaleDownPolicy


Engine = Literal["keda", "hpa"]


class AutoscalingSpec(RuledModel):
    """Replicas follow the role's load: the operator renders a KEDA ScaledObject (or an autoscaling/v2 HPA) and
    leaves the workload's replicas to it; the role's `replicas` is then not used."""

    RULES: ClassVar[tuple[Rule[AutoscalingSpec], ...]] = (
        Rule(
            ".minReplicas",
            lambda a: a.min_replicas <= a.max_replicas,
            lambda a: a.min_replicas,
            "is above maxReplicas",
            "give minReplicas <= maxReplicas",
            cel="self.minReplicas <= self.maxReplicas",
        ),
        Rule(
            ".minReplicas",
            lambda a: a.min_replicas > 0 or a.engine == "keda",
            lambda a: a.min_replicas,
            "only KEDA scales a workload to 0 (an HPA stops at 1)",
            "use engine: keda, or minReplicas: 1",
            cel="self.minReplicas > 0 || self.engine == 'keda'",
        ),
        Rule(
            ".signals",
            lambda a: a.engine == "keda" or all(s.adapter_metric is not None for s in a.signals),
            lambda a: [s.signal for s in a.signals if s.adapter_metric is None],
            "engine hpa reads every signal from the cluster's metrics adapter",
            "give each signal its adapterMetric (or use engine: keda, which queries Prometheus itself)",
            cel="self.engine == 'keda' || self.signals.all(s, has(s.adapterMetric))",
        ),
    )

    min_replicas: int = Field(default=1, ge=0, le=k.REPLICAS_MAX)
    """The fewest replicas; 0 (encoders only, KEDA only) lets the encoders go while no media request comes: text
    requests go on, and the first media request wakes one (held up to holdSeconds)."""
    max_replicas: int = Field(ge=1, le=k.REPLICAS_MAX)
    """The most replicas (mind the GPUs: each replica takes the role's tensorParallelSize of them)."""
    signals: Annotated[list[ScalingSignal], Field(max_length=4)] = []
    """What the role scales on; empty: the role's default (encoder inFlight 4, prefill waiting 2, decode running
    32 and kvCacheUsage 0.8)."""
    engine: Engine = "keda"
    """keda: a KEDA ScaledObject querying Prometheus (the operator's --prometheus-url); hpa: a plain
    autoscaling/v2 HorizontalPodAutoscaler on metrics the cluster's adapter serves (adapterMetric)."""
    scale_up: ScaleUpPolicy = ScaleUpPolicy()
    """How fast replicas are added (default: at once, up to 2 every 30 s)."""
    scale_down: ScaleDownPolicy = ScaleDownPolicy()
    """How fast replicas are removed (default: after 5 minutes of less load, 1 a minute)."""
    hold_seconds: int = Field(default=120, ge=1, le=600)
    """Encoders at 0 replicas only: how long the proxy holds a media request while an encoder starts (text requests
    never wait); past it, 503 with Retry-After. Give it the encoder's start time and some."""
    polling_seconds: int = Field(default=15, ge=1, le=600)
    """engine: keda: how often KEDA reads the signals (and, at 0 replicas, decides to wake the role)."""
