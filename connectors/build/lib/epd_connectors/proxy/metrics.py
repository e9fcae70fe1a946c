"""The proxy's Prometheus metrics, in a registry of its own (one per app, so tests can run several).

Stage latencies (encode, prefill, first token, total) say where a slow request spent its time; requests,
errors and retries by role and instance find the bad instance; in-flight and roster gauges show load and
membership; the affinity counters and ratio show whether repeated media meet the encoder that holds them.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from epd_connectors.proxy.roster import Roster

STAGE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Seconds; from a cached image's encode to a long generation."""

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ProxyMetrics:
    """Every metric the proxy exports."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.stage_seconds = Histogram(
            "epd_proxy_stage_seconds",
            "Latency of one request stage: encode, prefill, first_token, total",
            ["stage"],
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "epd_proxy_requests", "Client requests by endpoint and answer status", ["endpoint", "status"], registry=r
        )
        self.backend_requests = Counter(
            "epd_proxy_backend_requests", "Requests sent to backends", ["role", "instance"], registry=r
        )
        self.backend_errors = Counter(
            "epd_proxy_backend_errors", "Failed backend requests by kind", ["role", "instance", "kind"], registry=r
        )
        self.retries = Counter(
            "epd_proxy_retries",
            "Requests retried on another instance after this one failed",
            ["role", "instance"],
            registry=r,
        )
        self.in_flight = Gauge("epd_proxy_requests_in_flight", "Client requests being served", registry=r)
        self.roster = Gauge(
            "epd_proxy_roster_instances", "Known instances by role and health", ["role", "state"], registry=r
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
        self.affinity_ratio = Gauge(
            "epd_proxy_encoder_affinity_hit_ratio",
            "Share of media items that met their first-choice encoder",
            registry=r,
        )
        self._hits = 0
        self._items = 0
        self._children: dict[tuple[str, ...], Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        """The labelled child, cached: prometheus_client's labels() costs more than the update itself."""
        key = (str(id(metric)), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe_stage(self, stage: str, seconds: float) -> None:
        self._child(self.stage_seconds, stage).observe(seconds)

    def count_request(self, endpoint: str, status: str) -> None:
        self._child(self.requests, endpoint, status).inc()

    def count_backend(self, role: str, instance: str) -> None:
        self._child(self.backend_requests, role, instance).inc()

    def affinity_result(self, hit: bool) -> None:
        self._items += 1
        self._hits += int(hit)
        self.affinity.labels("hit" if hit else "miss").inc()
        self.affinity_ratio.set(self._hits / self._items)

    def render(self, roster: Roster) -> bytes:
        """The exposition text, with the roster gauges read now."""
        for role in roster.roles:
            instances = roster.instances(role)
            healthy = sum(1 for i in instances if i.healthy)
            self.roster.labels(role.value, "healthy").set(healthy)
            self.roster.labels(role.value, "unhealthy").set(len(instances) - healthy)
        return generate_latest(self.registry)
