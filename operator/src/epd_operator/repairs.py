"""Repair one child: apply it again from the last valid render after it was deleted or changed in a field we
own. Repairs of one child are paced (`pacing`), so a writer that keeps undoing ours does not turn into a tight
loop of writes; a namespace being deleted gets no repair and no Event."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from epd_operator import _kube, apply, managed_fields, status
from epd_operator.state import ChildKey, State, Tracked, wanted

log = logging.getLogger(__name__)

RETRY_REPAIR_S = 5.0
"""When a repair failed with an error worth retrying (API server busy), the next attempt."""


def waiting(state: State, key: ChildKey) -> bool:
    """Whether a repair of `key` waits for its turn (it will apply the render as it is then)."""
    return key in state.pending_repairs


async def repair(
    state: State, tracked: Tracked, key: ChildKey, live: dict[str, Any] | None, paced: bool = False
) -> None:
    """Apply one child of the last valid render again: it was deleted (`live` None) or changed by hand.
    Unless `paced` (its turn came), the pacer may put it off."""
    async with tracked.lock:
        want = wanted(tracked, key)  # again: a reconcile may have changed or pruned it meanwhile
        if not state.current(tracked) or want is None:
            return
        digest = apply.fingerprint(want)
        if live is not None and state.applied.unchanged(want, digest, live):
            return  # the event was the echo of a reconcile's apply, which held the lock
        if not paced and (delay := state.pacer.wait(key, time.monotonic())) > 0:
            _repair_later(state, tracked, key, live, delay)
            return
        owner = tracked.owner
        if live is None and not await status.exists(state.client, owner.namespace, owner.name, owner.uid):
            state.forget(owner.namespace, owner.name)  # the owner is going: GC deletes its children
            return
        try:
            # When our managedFields entry is the same before and after, the apply was a no-op (the event was
            # stale). Not the resourceVersion: a controller's status write may move it meanwhile.
            before = None if live is None else await apply.current(state.client, want)
            answers = await apply.apply(state.client, want, live)
        except _kube.NamespaceTerminatingError:
            state.leave_alone(tracked)
            return
        except _kube.KubeError as exc:
            state.event(tracked, "warn", reason="RepairFailed", message=f"{key[0]} {key[2]}: {exc}")
            if exc.retryable:
                _repair_later(state, tracked, key, live, RETRY_REPAIR_S)
            return
        after = answers[-1]
        written = before is None or managed_fields.held(after) != managed_fields.held(before)
        state.applied.record(want, digest, answers)
        state.remember(key, after, watched=False)
    cause = "deleted" if live is None else "changed in a field the operator owns"
    outcome = "written" if written else "no-op"
    log.info("%s/%s: %s %s was %s; applied again (%s)", *tracked.key, *key[::2], cause, outcome)
    if written:
        state.metrics.repairs.labels(key[0], "deleted" if live is None else "changed").inc()
        reason = "Restored" if live is None else "Reverted"
        state.event(tracked, "warn", reason=reason, message=f"{key[0]} {key[2]} was {cause}; applied it again")


def _repair_later(state: State, tracked: Tracked, key: ChildKey, live: dict[str, Any] | None, delay: float) -> None:
    """Repair `key` after `delay`, once however many events arrive meanwhile."""
    if key in state.pending_repairs:
        return

    async def later() -> None:
        await asyncio.sleep(delay)
        state.pending_repairs.pop(key, None)  # events from here on may ask for another repair
        await repair(state, tracked, key, live, paced=True)

    state.pending_repairs[key] = state.spawn(later())
