"""The repair step of a reconcile pass: apply a child again from the last applied render after it was deleted or
changed in a field we own. Repairs of one child are paced (`pacing`), so a writer that keeps undoing ours does not
turn into a tight loop of writes; a repair waiting for its turn applies the render as it is then.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from epd_operator import _kube, apply, calls, managed_fields
from epd_operator.runtime import Runtime
from epd_operator.state import DeploymentState, wanted
from epd_operator.world import ChildKey, controller_uid

log = logging.getLogger(__name__)

RETRY_REPAIR_S = 5.0
"""When a repair failed with an error worth retrying (API server busy), the next attempt."""


class OwnerGoneError(Exception):
    """A child was deleted because its EPDDeployment is going: the garbage collector is at work, not a person."""


async def repair(
    rt: Runtime, state: DeploymentState, touched: Mapping[ChildKey, dict[str, Any] | None]
) -> tuple[DeploymentState, float | None]:
    """Repair what `touched` (the children seen since the last pass: the newest body, None when deleted) and the
    repairs whose turn came call for; the state with the repairs still waiting, and when the first is due."""
    now = time.monotonic()
    waiting = dict(state.waiting)
    turns: list[tuple[ChildKey, dict[str, Any] | None, bool]] = []
    for key, live in touched.items():
        if key in waiting:
            waiting[key] = (waiting[key][0], live)  # its turn comes; it acts on the newest body
        else:
            turns.append((key, live, False))
    for key, (due, live) in list(waiting.items()):
        if due <= now:
            del waiting[key]
            turns.append((key, live, True))
    for key, live, paced in turns:
        retry_at = await _repair_one(rt, state, key, live, now=now, paced=paced)
        if retry_at is not None:
            waiting[key] = (retry_at, live)
    first = min((due for due, _ in waiting.values()), default=None)
    return replace(state, waiting=waiting), None if first is None else max(0.0, first - now)


async def _repair_one(
    rt: Runtime, state: DeploymentState, key: ChildKey, live: dict[str, Any] | None, *, now: float, paced: bool
) -> float | None:
    """Apply child `key` again if it needs it; when to try again (its turn, or a retry), None when done."""
    want = wanted(state.desired, key)
    if want is None:
        return None  # pruned, or not ours
    if live is not None and controller_uid(live.get("metadata", {})) not in (None, state.owner.uid):
        return None  # a namesake's, controlled by another EPDDeployment
    digest = apply.fingerprint(want)
    if live is not None and (live["metadata"].get("deletionTimestamp") or rt.applied.unchanged(want, digest, live)):
        return None  # going (its DELETED event follows), or as we left it: our own apply, a status update...
    if not paced and (delay := rt.pacer.wait(key, now)) > 0:
        return now + delay
    owner = state.owner
    if live is None and not await calls.deployment_exists(rt.client, owner.namespace, owner.name, owner.uid):
        raise OwnerGoneError(owner.name)
    try:
        # When our managedFields entry is the same before and after, the apply was a no-op (the event was stale).
        # Not the resourceVersion: a controller's status write may move it meanwhile.
        before = None if live is None else await apply.current(rt.client, want)
        answers = await apply.apply(rt.client, want, live)
    except _kube.NamespaceTerminatingError:
        raise
    except _kube.KubeError as exc:
        rt.event(owner, "warn", reason="RepairFailed", message=f"{key[0]} {key[2]}: {exc}")
        return now + RETRY_REPAIR_S if exc.retryable else None
    after = answers[-1]
    written = before is None or managed_fields.held(after) != managed_fields.held(before)
    rt.applied.record(want, digest, answers)
    rt.world.remember(key, after, watched=False)
    cause = "deleted" if live is None else "changed in a field the operator owns"
    log.info("%s/%s: %s %s was %s; applied again (%s)", *state.key, *key[::2], cause, "written" if written else "no-op")
    if written:
        rt.metrics.repairs.labels(key[0], "deleted" if live is None else "changed").inc()
        reason = "Restored" if live is None else "Reverted"
        rt.event(owner, "warn", reason, f"{key[0]} {key[2]} was {cause}; applied it again")
    return None
