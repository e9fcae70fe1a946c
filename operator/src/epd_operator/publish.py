"""The status step of a reconcile pass: compute the status from the state and the world, announce the conditions
that flipped, and write it if it changed: at once when it is urgent (`status.urgent`), else at most once per
`PROGRESS_INTERVAL_S`, so a deployment coming up costs the API server a few writes rather than one per pod."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from epd_operator import _kube, autoscalers, calls, status
from epd_operator.api import constants as c
from epd_operator.api.resource import Owner
from epd_operator.api.status import EPDDeploymentStatus
from epd_operator.runtime import Runtime
from epd_operator.state import DeploymentState

log = logging.getLogger(__name__)

RETRY_STATUS_S = 2.0
"""When a status write failed (API server busy), the next attempt."""

PROGRESS_INTERVAL_S = 5.0
"""The least time between two writes of progress alone (counts, messages, a role coming up). Fifty deployments
coming up at once otherwise wrote five statuses each (bench/operator), and each is an update of the whole custom
resource, checked against its schema and its CEL rules."""

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
    """Compute the status and write it if it changed and its turn came; the state with it, and when to come back
    (a write put off, or one that failed)."""
    new = status.compute(facts(rt, state))
    if new != state.status:
        rt.metrics.set_phase(state.key, new.phase)
        rt.metrics.set_conditions(state.key, {x.type: x.status for x in new.conditions})
        _announce_flips(rt, state.owner, state.status, new)
        state = replace(state, status=new)
    if new == state.written:
        return state, None
    now = time.monotonic()
    if state.written_at is not None and not status.urgent(state.written, new):
        wait = state.written_at + PROGRESS_INTERVAL_S - now
        if wait > 0:
            return state, wait
    owner = state.owner
    try:
        if not await calls.write_status(rt.client, owner.namespace, owner.name, new):
            return state, None  # deleted meanwhile: its DELETED event follows
    except _kube.KubeError as exc:
        log.warning("%s/%s: status not written, retrying: %s", *state.key, exc)
        return state, RETRY_STATUS_S
    rt.metrics.status_writes.inc()
    return replace(state, written=new, written_at=now), None


def _announce_flips(rt: Runtime, owner: Owner, previous: EPDDeploymentStatus, new: EPDDeploymentStatus) -> None:
    first = not previous.conditions  # a new object starts not ready: nothing to announce
    before = {x.type: x.status for x in previous.conditions}
    for flipped in status.flips(previous, new):
        event = f"{flipped.type} is {flipped.status}: {flipped.message}"[:1000]
        recovered = flipped.type == c.COND_TRANSFER_READY and before.get(flipped.type) == "False"
        if flipped.status == "True" and (flipped.type in ANNOUNCED or recovered):
            rt.event(owner, "info", flipped.type, event)
        elif flipped.status == "False" and not first and flipped.type != c.COND_VALID:  # InvalidSpec said it
            level = "info" if flipped.reason in status.PROGRESS_REASONS else "warn"
            rt.event(owner, level, flipped.reason, event)
