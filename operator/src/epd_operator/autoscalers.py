"""The Autoscaling condition, from what each autoscaled workload's autoscaler reports (pure).

A KEDA ScaledObject reports Ready (its triggers and target are usable) and Fallback; an HPA reports AbleToScale
and ScalingActive (it can read its metrics). The condition is True while every autoscaler can scale, and
otherwise carries the autoscaler's own reason and message, naming the role; it is not part of Ready (a role whose
autoscaler cannot scale still serves at its current count).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

REASON_SCALING = "Scaling"
"""Autoscaling is True: every autoscaler reads its signals and can scale."""
REASON_NOT_AUTOSCALED = "NotAutoscaled"
"""Autoscaling is True: no role is autoscaled."""
REASON_NO_REPORT = "AutoscalerNotReporting"
"""Autoscaling is Unknown: an autoscaler has reported nothing yet (KEDA not running, or just created)."""

_BAD = {
    # kind -> conditions whose status means it cannot scale
    "ScaledObject": (("Ready", "False"), ("Fallback", "True")),
    "HorizontalPodAutoscaler": (("AbleToScale", "False"), ("ScalingActive", "False")),
}
_IDLE_REASONS = frozenset({"ScalingDisabled"})
"""ScalingActive False for this reason means "scaled to zero on purpose" (KEDA at minReplicaCount 0)."""


@dataclass(frozen=True)
class Reading:
    """One autoscaled workload and its autoscaler as last seen."""

    what: str
    """The role (and pool) it scales, for messages: "encoder", "prefill pool tp2"."""
    kind: str
    """ScaledObject or HorizontalPodAutoscaler."""
    name: str
    live: dict[str, Any] | None
    """The autoscaler's object; None when not seen."""
    replicas: int
    """The workload's replicas now."""
    minimum: int
    maximum: int


def _word(reason: str) -> str:
    """A reason as a condition's one CamelCase word."""
    cleaned = re.sub(r"[^A-Za-z0-9_]", "", reason)
    return cleaned if cleaned[:1].isalpha() else f"Autoscaler{cleaned}"


def _problem(reading: Reading) -> tuple[str, str] | None:
    """(reason, message) when this autoscaler reports it cannot scale."""
    for cond in ((reading.live or {}).get("status") or {}).get("conditions") or []:
        kind, state = cond.get("type"), cond.get("status")
        if (kind, state) in _BAD.get(reading.kind, ()) and cond.get("reason") not in _IDLE_REASONS:
            reason = str(cond.get("reason") or kind)
            detail = str(cond.get("message") or "").strip()
            return _word(reason), f"{reading.what} ({reading.kind} {reading.name}): {kind} {state}, {reason}: {detail}"
    return None


def _reported(reading: Reading) -> bool:
    return bool(((reading.live or {}).get("status") or {}).get("conditions"))


def condition(readings: Sequence[Reading]) -> tuple[Literal["True", "False", "Unknown"], str, str]:
    """(status, reason, message) of Autoscaling."""
    if not readings:
        return "True", REASON_NOT_AUTOSCALED, "no role is autoscaled"
    problems = [p for r in readings if (p := _problem(r)) is not None]
    if problems:
        return "False", problems[0][0], "; ".join(message for _, message in problems)
    silent = [r for r in readings if not _reported(r)]
    if silent:
        named = ", ".join(f"{r.what} ({r.kind} {r.name})" for r in silent)
        return "Unknown", REASON_NO_REPORT, f"no report yet from the autoscaler of {named}"
    counts = "; ".join(f"{r.what} at {r.replicas} of {r.minimum}-{r.maximum}" for r in readings)
    return "True", REASON_SCALING, f"every autoscaler can scale: {counts}"
