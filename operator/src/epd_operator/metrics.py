"""The operator's own Prometheus metrics, and the HTTP server that exposes them.

One `Metrics` object per process holds every metric in its own registry (not prometheus_client's global one),
so tests can make as many as they like. The two gauges are summed over deployments from per-deployment
tallies: a deployment that changes kind counts or phase, or disappears, moves the totals exactly once.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Seconds. A reconcile is a few list and apply requests: tens of milliseconds, seconds under load."""

PHASES = ("Pending", "Progressing", "Ready", "Degraded", "Invalid")

DeploymentKey = tuple[str, str]
"""(namespace, name) of an EPDDeployment."""


class Metrics:
    """Every metric of one operator process."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.reconciles = Counter(
            "epd_operator_reconciles",
            "Reconciles of an EPDDeployment, by outcome (changed, unchanged, invalid, conflict, error).",
            ["outcome"],
            registry=self.registry,
        )
        self.errors = Counter(
            "epd_operator_reconcile_errors",
            "Reconciles that failed, by reason (InvalidSpec, an API error type, Unexpected).",
            ["reason"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "epd_operator_reconcile_duration_seconds",
            "Time of one reconcile: parse, render, apply, prune, status.",
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.status_writes = Counter(
            "epd_operator_status_writes",
            "Writes of an EPDDeployment status (only when it changed).",
            registry=self.registry,
        )
        self.repairs = Counter(
            "epd_operator_repairs",
            "Children applied again after a hand change, by kind and cause (deleted, changed); a steady rise on one "
            "child means another writer keeps undoing the operator's (repairs of one child are paced).",
            ["kind", "cause"],
            registry=self.registry,
        )
        self.managed_objects = Gauge(
            "epd_operator_managed_objects",
            "Children the operator manages, by kind.",
            ["kind"],
            registry=self.registry,
        )
        self.deployments = Gauge(
            "epd_operator_deployments", "EPDDeployments by status phase.", ["phase"], registry=self.registry
        )
        for phase in PHASES:
            self.deployments.labels(phase).set(0)
        self.conditions = Gauge(
            "epd_operator_condition",
            "Each EPDDeployment's status conditions: 1 while True, 0 while False or Unknown (the alerts read it).",
            ["namespace", "name", "type"],
            registry=self.registry,
        )
        self._objects: dict[DeploymentKey, Tally[str]] = {}
        self._phases: dict[DeploymentKey, str] = {}
        self._condition_types: dict[DeploymentKey, set[str]] = {}
        self._kinds: set[str] = set()

    def set_objects(self, key: DeploymentKey, kinds: Mapping[str, int]) -> None:
        """The children of one deployment, counted by kind."""
        self._objects[key] = Tally(kinds)
        self._publish_objects()

    def set_phase(self, key: DeploymentKey, phase: str) -> None:
        if self._phases.get(key) != phase:
            self._phases[key] = phase
            self._publish_phases()

    def set_conditions(self, key: DeploymentKey, conditions: Mapping[str, str]) -> None:
        """One deployment's conditions by type, as status wrote them ("True", "False", "Unknown")."""
        for kind, state in conditions.items():
            self.conditions.labels(*key, kind).set(1 if state == "True" else 0)
        self._condition_types.setdefault(key, set()).update(conditions)

    def forget(self, key: DeploymentKey) -> None:
        """The deployment is gone: its children, its phase and its conditions no longer count."""
        for kind in self._condition_types.pop(key, set()):
            self.conditions.remove(*key, kind)
        if self._objects.pop(key, None) is not None:
            self._publish_objects()
        if self._phases.pop(key, None) is not None:
            self._publish_phases()

    def _publish_objects(self) -> None:
        total: Tally[str] = Tally()
        for kinds in self._objects.values():
            total.update(kinds)
        self._kinds.update(total)  # a kind no deployment has any more shows 0, not its last count
        for kind in self._kinds:
            self.managed_objects.labels(kind).set(total.get(kind, 0))

    def _publish_phases(self) -> None:
        total = Tally(self._phases.values())
        for phase in PHASES:
            self.deployments.labels(phase).set(total.get(phase, 0))

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        """Serve /metrics on host:port in a background thread (prometheus_client's own server)."""
        start_http_server(port, addr=host, registry=self.registry)
