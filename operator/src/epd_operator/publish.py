"""The status step of a reconcile pass: compute the status from the state and the world, write it only if it
changed, and announce the conditions that flipped."""

from __future__ import annotations

import logging
from dataclasses import replace

from epd_operator import _kube, autoscalers, calls, status
from epd_operator.api import constants as c
from epd_operator.api.status import EPDDeploymentStatus
from epd_operator.runtime import Runtime
from epd_operator.state import DeploymentState

log = logging.getLogger(__name__)

RETRY_STATUS_S = 2.0
"""When a status write failed (API server busy), the next attempt."""

ANNOUNCED = frozenset({c.COND_VALID, c.COND_READY})
"""Conditions announced by an Event when they turn True; any condition is announced when it turns False."""


def facts(rt: Runtime, state: DeploymentState) -> status.Facts:
    """What `status.compute` needs: the state, and the workloads of the last applied render as last seen."""
    owner, desired = state.owner, state.desired
    observed = None
    if desired is not None:
        observed = [
            status.observe(w, rt.world.workloads.get((w.kind, owner.namespace, w.name))) for w in desired.workloads
        ]
    return status.Facts(
        autoscalers=_autoscalers(rt, state),
        generation=owner.generation,
        problems=state.problems,
        observed=observed,
        derived=desired.derived if desired is not None else None,
        previous=state.status,
        now=status.now(),
        blocked=state.blocked,
        store=state.store,
        transfers=state.transfers,
    )


def _autoscalers(rt: Runtime, state: DeploymentState) -> list[autoscalers.Reading]:
    owner, desired = state.owner, state.desired
    if desired is None:
        return []
    found = []
    for w in desired.workloads:
        if w.autoscaler is None:
            continue
        live = rt.world.workloads.get((w.kind, owner.namespace, w.name))
        replicas = ((live or {}).get("spec") or {}).get("replicas", 0)
        found.append(
            autoscalers.Reading(
                what=w.role.value,
                kind=w.autoscaler,
                name=w.name,
                live=rt.world.workloads.get((w.autoscaler, owner.namespace, w.name)),
                replicas=replicas if isinstance(replicas, int) else 0,
                minimum=w.bounds[0],
                maximum=w.bounds[1],
            )
        )
    return found


async def publish(rt: Runtime, state: DeploymentState) -> tuple[DeploymentState, float | None]:
    """Write the status if it changed; the state with it, and when to try again after a failed write."""
    new = status.compute(facts(rt, state))
    if new == state.status:
        return state, None
    owner = state.owner
    try:
        if not await calls.write_status(rt.client, owner.namespace, owner.name, new):
            return state, None  # deleted meanwhile: its DELETED event follows
    except _kube.KubeError as exc:
        log.warning("%s/%s: status not written, retrying: %s", *state.key, exc)
        return state, RETRY_STATUS_S
    rt.metrics.status_writes.inc()
    rt.metrics.set_phase(state.key, new.phase)
    rt.metrics.set_conditions(state.key, {x.type: x.status for x in new.conditions})
    _announce_flips(rt, state, new)
    return replace(state, status=new), None


def _announce_flips(rt: Runtime, state: DeploymentState, new: EPDDeploymentStatus) -> None:
    first = not state.status.conditions  # a new object starts not ready: nothing to announce
    before = {x.type: x.status for x in state.status.conditions}
    for flipped in status.flips(state.status, new):
        event = f"{flipped.type} is {flipped.status}: {flipped.message}"[:1000]
        recovered = flipped.type == c.COND_TRANSFER_READY and before.get(flipped.type) == "False"
        if flipped.status == "True" and (flipped.type in ANNOUNCED or recovered):
            rt.event(state.owner, "info", flipped.type, event)
        elif flipped.status == "False" and not first and flipped.type != c.COND_VALID:  # InvalidSpec said it
            level = "info" if flipped.reason in status.PROGRESS_REASONS else "warn"
            rt.event(state.owner, level, flipped.reason, event)
