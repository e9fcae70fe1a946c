"""Which model pods may take traffic: the pure decision behind the revision-ready readiness gate.

A roll starts a new pod of every model role beside the old ones, and a workload deletes its old pod as soon as its
new one is Ready. Were the roles' pods Ready one by one, a new encoder would retire the old one while only old
prefills serve, and no revision would have a whole set for a minute. The gate holds every new pod out of Ready
until each model role has a pod of its revision with its containers ready; then all open at once, and only then
do the old pods go. A gate once open stays open: a set that loses a pod later is repaired by its workload, not
taken out of service.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from epd_connectors.config.roles import VLLM_ROLES
from epd_operator.api import constants as c
from epd_operator.render import RoleWorkload


@dataclass(frozen=True)
class ModelPod:
    """What the gate needs of one encoder, prefill, decode or PD pod."""

    name: str
    role: str
    revision: str
    containers_ready: bool
    gate_open: bool
    terminating: bool


def model_pod(pod: Mapping[str, Any]) -> ModelPod | None:
    """The facts of a watched pod; None for a pod without a role and revision (not a model pod)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    role, revision = labels.get(c.LABEL_ROLE), labels.get(c.LABEL_MODEL_REVISION)
    if not role or not revision:
        return None
    conditions = {x.get("type"): x.get("status") for x in (pod.get("status") or {}).get("conditions") or []}
    return ModelPod(
        name=str(meta.get("name", "")),
        role=str(role),
        revision=str(revision),
        containers_ready=conditions.get("ContainersReady") == "True",
        gate_open=conditions.get(c.CONDITION_REVISION_READY) == "True",
        terminating=bool(meta.get("deletionTimestamp")),
    )


def complete_revisions(pods: Iterable[ModelPod], roles: frozenset[str]) -> frozenset[str]:
    """The revisions that have, for every role in `roles`, a pod that is not going and whose containers are
    ready."""
    serving: dict[str, set[str]] = {}
    for pod in pods:
        if pod.containers_ready and not pod.terminating:
            serving.setdefault(pod.revision, set()).add(pod.role)
    return frozenset(revision for revision, present in serving.items() if roles <= present)


def gates_to_open(pods: Iterable[ModelPod], roles: frozenset[str]) -> list[ModelPod]:
    """The pods whose gate to open now: every pod of a complete revision whose gate is closed (pods still
    starting too, so a replacement or a scale-out of a serving revision is Ready as soon as it is up)."""
    pods = list(pods)
    complete = complete_revisions(pods, roles)
    opening = [p for p in pods if p.revision in complete and not p.gate_open and not p.terminating]
    return sorted(opening, key=lambda p: p.name)


def open_gate_patch(pod: ModelPod, now: str) -> dict[str, Any]:
    """The strategic merge patch of the pod's status that opens its gate (conditions merge by type)."""
    condition = {
        "type": c.CONDITION_REVISION_READY,
        "status": "True",
        "reason": "RevisionComplete",
        "message": f"every model role has a pod of revision {pod.revision} with its containers ready",
        "lastTransitionTime": now,
    }
    return {"status": {"conditions": [condition]}}


def model_roles(workloads: Iterable[RoleWorkload]) -> frozenset[str]:
    """The model roles a whole set needs: those with replicas in the current render, and autoscaled ones that
    never go below 1 (encoders that may scale to zero are not waited for)."""
    return frozenset(
        w.role.value
        for w in workloads
        if w.role in VLLM_ROLES and ((w.replicas or 0) > 0 or (w.autoscaled and w.bounds[0] > 0))
    )
