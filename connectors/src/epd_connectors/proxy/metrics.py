"""The proxy's Prometheus metrics, in a registry of its own (one per app, so tests can run several).

Stage latencies (encode, prefill, first token, total) say where a slow request spent its time; requests,
errors and retries by role and instance find the bad instance; in-flight and roster gauges show load and
membership; the affinity counters and ratio show whether repeated media meet the encoder that holds them; the
transfer gauge counts the paths whose canaries pass and fail.
What every request updates is counted in plain numbers (`RequestCounts`) and becomes metric families only when
scraped: prometheus_client takes a lock, and a histogram walks its buckets, on every update.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from epd_connectors.proxy.roster import Roster

STAGE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Seconds; from a cached image's encode to a long generation."""

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class RequestCounts(Collector):
    """The per-request metrics: stage latencies, client and backend requests, requests in flight."""

    def __init__(self) -> None:
        self.stages: dict[str, list[int]] = {}
        """Per stage: the count in each bucket of STAGE_BUCKETS, then those above the last."""
        self.stage_sums: dict[str, float] = {}
        self.requests: dict[tuple[str, str], int] = {}
        self.backend: dict[tuple[str, str], int] = {}
        self.in_flight = 0

    def observe(self, stage: str, seconds: float) -> None:
        counts = self.stages.get(stage)
        if counts is None:
            counts = self.stages[stage] = [0] * (len(STAGE_BUCKETS) + 1)
            self.stage_sums[stage] = 0.0
        counts[bisect.bisect_left(STAGE_BUCKETS, seconds)] += 1
        self.stage_sums[stage] += seconds

    def collect(self) -> Iterator[Metric]:
        stages = HistogramMetricFamily(
            "epd_proxy_stage_seconds",
            "Latency of one request stage: encode, prefill, first_token, total",
            labels=["stage"],
        )
        for stage, counts in self.stages.items():
            cumulative, buckets = 0, []
            for bound, count in zip((*STAGE_BUCKETS, float("inf")), counts, strict=True):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            stages.add_metric([stage], buckets, self.stage_sums[stage])
        yield stages
        requests = CounterMetricFamily(
            "epd_proxy_requests", "Client requests by endpoint and answer status", labels=["endpoint", "status"]
        )
        for labels, value in self.requests.items():
            requests.add_metric(labels, value)
        yield requests
        backend = CounterMetricFamily(
            "epd_proxy_backend_requests", "Requests sent to backends", labels=["role", "instance"]
        )
        for labels, value in self.backend.items():
            backend.add_metric(labels, value)
        yield backend
        yield GaugeMetricFamily("epd_proxy_requests_in_flight", "Client requests being served", value=self.in_flight)


class ProxyMetrics:
    """Every metric the proxy exports."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.counts = RequestCounts()
        r.register(self.counts)
        self.backend_errors = Counter(
            "epd_proxy_backend_errors", "Failed backend requests by kind", ["role", "instance", "kind"], registry=r
        )
        self.retries = Counter(
            "epd_proxy_retries",
            "Requests retried on another instance after this one failed",
            ["role", "instance"],
            registry=r,
        )
        self.roster = Gauge(
            "epd_proxy_roster_instances", "Known instances by role and health", ["role", "state"], registry=r
        )
        self.backend_in_flight = Gauge(
            "epd_proxy_backend_in_flight",
            "Requests the proxy has outstanding at each role's instances",
            ["role"],
            registry=r,
        )
        self.affinity = Counter(
            "epd_proxy_encoder_affinity",
            "Media items sent to their first-choice encoder (hit) or not (miss)",
            ["result"],
            registry=r,
        )
        self.media_items = Counter(
            "epd_proxy_media_items",
            "Media items sent on as references (rewritten: the encoder reported metadata) or as media (kept)",
            ["result"],
            registry=r,
        )
        self.requests_waiting = Gauge(
            "epd_proxy_requests_waiting",
            "Requests held for an instance of a role scaled to zero (encoders); the autoscaler wakes it on these",
            ["role"],
            registry=r,
        )
        self.requests_waiting.labels("encoder").set(0)  # the series exists before the first wait, for queries
        self.affinity_ratio = Gauge(
            "epd_proxy_encoder_affinity_hit_ratio",
            "Share of media items that met their first-choice encoder",
            registry=r,
        )
        self.transfer_pairs = Gauge(
            "epd_proxy_transfer_pairs",
            "Transfer paths (encoder -> EC consumer, prefill -> decode) by their canaries' verdict",
            ["path", "state"],
            registry=r,
        )
        self._hits = 0
        self._items = 0

    def observe_stage(self, stage: str, seconds: float) -> None:
        self.counts.observe(stage, seconds)

    def count_request(self, endpoint: str, status: str) -> None:
        key = (endpoint, status)
        self.counts.requests[key] = self.counts.requests.get(key, 0) + 1

    def count_backend(self, role: str, instance: str) -> None:
        key = (role, instance)
        self.counts.backend[key] = self.counts.backend.get(key, 0) + 1

    def affinity_result(self, hit: bool) -> None:
        self._items += 1
        self._hits += int(hit)
        self.affinity.labels("hit" if hit else "miss").inc()
        self.affinity_ratio.set(self._hits / self._items)

    def render(self, roster: Roster, transfers: Iterable[tuple[str, str]] = ()) -> bytes:
        """The exposition text, with the roster, in-flight and transfer gauges read now (nothing per request);
        `transfers` are the canaries' (path, verdict) per pair."""
        counts = dict.fromkeys(((path, state) for path in ("ec", "kv") for state in ("ok", "failing", "unchecked")), 0)
        for key in transfers:
            counts[key] += 1
        for (path, state), count in counts.items():
            self.transfer_pairs.labels(path, state).set(count)
        for role in roster.roles:
            instances = roster.instances(role)
            healthy = sum(1 for i in instances if i.healthy)
            self.roster.labels(role.value, "healthy").set(healthy)
            self.roster.labels(role.value, "unhealthy").set(len(instances) - healthy)
            self.backend_in_flight.labels(role.value).set(sum(i.outstanding for i in instances))
        return generate_latest(self.registry)
