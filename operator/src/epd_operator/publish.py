"""Publish an EPDDeployment's status: recompute it from what the process knows, write it only if it changed,
and announce the conditions that flipped. Workload events arriving together share one write."""

from __future__ import annotations

import asyncio
import logging

from epd_operator import _kube, status
from epd_operator.api import constants as c
from epd_operator.api.status import EPDDeploymentStatus
from epd_operator.state import State, Tracked

log = logging.getLogger(__name__)

STATUS_DELAY_S = 0.2
"""Workload events this close together share one status write: while a deployment comes up its workloads
report in bursts (created, scheduled, ready), and each write costs the API server more than the wait costs."""
RETRY_STATUS_S = 2.0
"""When a status write failed (API server busy), the next attempt."""

ANNOUNCED = frozenset({c.COND_VALID, c.COND_READY})
"""Conditions announced by an Event when they turn True; any condition is announced when it turns False."""


async def publish(state: State, tracked: Tracked) -> None:
    """Recompute the status from what is known; write it only if it changed. Call with the lock held."""
    owner, desired = tracked.owner, tracked.desired
    observed = None
    if desired is not None:
        observed = [
            status.observe(w, state.workloads.get((w.kind, owner.namespace, w.name))) for w in desired.workloads
        ]
    facts = status.Facts(
        generation=owner.generation,
        problems=tracked.problems,
        observed=observed,
        derived=desired.derived if desired is not None else None,
        previous=tracked.status,
        now=status.now(),
        blocked=tracked.blocked,
        store=tracked.store,
        transfers=tracked.transfers,
    )
    new = status.compute(facts)
    if new == tracked.status:
        return
    if not await status.write(state.client, owner.namespace, owner.name, new):
        return  # deleted meanwhile
    state.metrics.status_writes.inc()
    state.metrics.set_phase((owner.namespace, owner.name), new.phase)
    state.metrics.set_conditions((owner.namespace, owner.name), {x.type: x.status for x in new.conditions})
    _announce_flips(state, tracked, new)
    tracked.status = new


def _announce_flips(state: State, tracked: Tracked, new: EPDDeploymentStatus) -> None:
    first = not tracked.status.conditions  # a new object starts not ready: nothing to announce
    before = {x.type: x.status for x in tracked.status.conditions}
    for flipped in status.flips(tracked.status, new):
        event = f"{flipped.type} is {flipped.status}: {flipped.message}"[:1000]
        recovered = flipped.type == c.COND_TRANSFER_READY and before.get(flipped.type) == "False"
        if flipped.status == "True" and (flipped.type in ANNOUNCED or recovered):
            state.event(tracked, "info", reason=flipped.type, message=event)
        elif flipped.status == "False" and not first and flipped.type != c.COND_VALID:  # InvalidSpec said it
            if flipped.reason in status.PROGRESS_REASONS:
                state.event(tracked, "info", reason=flipped.reason, message=event)
            else:
                state.event(tracked, "warn", reason=flipped.reason, message=event)


def publish_later(state: State, tracked: Tracked, delay: float = STATUS_DELAY_S) -> None:
    """Publish the status after `delay`, once for every event that arrives meanwhile."""
    if tracked.pending is None or tracked.pending.done():
        tracked.pending = state.spawn(_publish_after(state, tracked, delay))


async def _publish_after(state: State, tracked: Tracked, delay: float) -> None:
    await asyncio.sleep(delay)
    tracked.pending = None  # events from here on schedule another one
    async with tracked.lock:
        if not state.current(tracked):
            return
        try:
            await publish(state, tracked)
        except _kube.KubeError as exc:
            log.warning("%s/%s: status not written, retrying: %s", *tracked.key, exc)
            publish_later(state, tracked, RETRY_STATUS_S)
