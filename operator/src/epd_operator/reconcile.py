"""One reconcile pass of one EPDDeployment, top to bottom: read it from the world, render its spec, apply the
children (or repair the ones someone changed or deleted), open the model pods' revision gates, follow its master
and proxy, write its status. The state goes in and comes out (None: the deployment is gone), with when to come back.

A spec whose children cannot be applied (another EPDDeployment holds one of their names, or the API server
refuses one) is reported in Ready with the reason and the server's message, for the generation it concerns. A
name conflict is tried again when the object in the way is deleted, or when the spec changes; a refusal when the
spec changes; a busy or unreachable server after `RETRY_DELAY_S`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from epd_operator import _kube, apply, repairs, status, store_watch, transfer_watch
from epd_operator.api.resource import InvalidSpecError, Owner, parse_spec
from epd_operator.gates import open_gates
from epd_operator.polling import Poll
from epd_operator.publish import publish
from epd_operator.render import render_desired
from epd_operator.runtime import Runtime
from epd_operator.state import DeploymentState, from_body, owner_of_body
from epd_operator.world import ChildKey, Key

log = logging.getLogger(__name__)

RETRY_DELAY_S = 5.0
"""Before an apply the API server failed is tried again; doubled after each further failure, up to `RETRY_MAX_S`."""
RETRY_MAX_S = 300.0

TRANSIENT_STATUSES = frozenset({0, 404, 409, 429, 502, 503, 504})
"""API answers that say nothing about the object sent (no answer, busy, a race, a cache not caught up yet):
retried without a word in status. Any other failure is the server refusing what we sent (400, 422, a 500
from a value it cannot store, a 403 of missing RBAC), and Ready reports it."""

POLLS: tuple[Poll[Any], ...] = (store_watch.POLL, transfer_watch.POLL)

Touched = Mapping[ChildKey, dict[str, Any] | None]


async def reconcile(
    rt: Runtime, key: Key, before: DeploymentState | None
) -> tuple[DeploymentState | None, float | None]:
    """One pass; the new state (None: forget the deployment) and the seconds after which to pass again."""
    body = rt.world.deployments.get(key)
    touched = rt.world.take_touched(key)
    if body is None or body["metadata"].get("deletionTimestamp"):
        # Gone, or going (a foreground deletion waits for its children): nothing to apply or repair.
        if before is not None:
            forget(rt, before)
        return None, None
    if before is not None and before.owner.uid != body["metadata"]["uid"]:
        _release(rt, before)  # deleted and created again under the same name
        before = None
    state = before if before is not None else first_seen(rt, body)
    state = _render(rt, state, body)
    try:
        state, apply_again = await _apply(rt, state, touched)
    except _kube.NamespaceTerminatingError:
        log.info("%s/%s: the namespace is being deleted; leaving it alone", *key)
        forget(rt, state)
        return None, None
    except repairs.OwnerGoneError:
        forget(rt, state)
        return None, None
    state = await open_gates(rt, state)
    state = _read(rt, state)
    state, status_again = await publish(rt, state)
    agains = [s for s in (apply_again, status_again) if s is not None]
    return state, min(agains, default=None)


def first_seen(rt: Runtime, body: Mapping[str, Any]) -> DeploymentState:
    """A deployment new to this process; a status an earlier process wrote counts until we write again."""
    state = from_body(body)
    if state.status.conditions:
        rt.metrics.set_phase(state.key, state.status.phase)
    return state


def _render(rt: Runtime, state: DeploymentState, body: Mapping[str, Any]) -> DeploymentState:
    """The spec's children, once per generation; an invalid spec's problems go to status, children untouched."""
    owner = owner_of_body(body)
    if state.rendered_generation == owner.generation:
        return state
    try:
        candidate = render_desired(owner, parse_spec(body.get("spec") or {}), rt.settings.defaults)
    except InvalidSpecError as exc:
        if tuple(exc.problems) != state.problems:
            rt.event(owner, "warn", reason="InvalidSpec", message=str(exc))
        rt.metrics.errors.labels("InvalidSpec").inc()
        rt.metrics.reconciles.labels("invalid").inc()
        log.warning("%s/%s: invalid spec, children left as they are: %s", *state.key, exc)
        problems = tuple(exc.problems)
        return replace(state, owner=owner, rendered_generation=owner.generation, candidate=None, problems=problems)
    if state.problems:
        rt.event(owner, "info", reason="SpecValid", message="the spec is valid again; applying it")
    return replace(state, rendered_generation=owner.generation, candidate=candidate, problems=())


async def _apply(rt: Runtime, state: DeploymentState, touched: Touched) -> tuple[DeploymentState, float | None]:
    """Apply a render not applied yet, else repair what `touched` and the waiting repairs call for."""
    if state.blocking and any(touched.get(k, {}) is None for k in state.blocking):
        state = replace(state, refused_generation=None, blocking=frozenset())  # the object in the way is gone
    candidate = state.candidate
    generation = state.rendered_generation
    if candidate is None or generation in (state.synced_generation, state.refused_generation):
        return await repairs.repair(rt, state, touched)
    owner = replace(state.owner, generation=generation) if generation is not None else state.owner
    began = time.perf_counter()
    # Only a first try may skip the listing: after anything was applied (or tried), the watches show the children.
    first = state.desired is None and state.refused_generation is None and not state.failed_applies
    unclaimed = first and rt.world.unclaimed(state.key, [apply.key_of(o) for o in candidate.objects])
    try:
        async with rt.syncs:
            result = await apply.sync(rt.client, owner, candidate.objects, rt.applied, unclaimed=unclaimed)
    except apply.NameConflictError as exc:
        log.warning("%s/%s: name conflict, nothing applied: %s", *state.key, exc)
        rt.metrics.errors.labels("NameConflict").inc()
        rt.metrics.reconciles.labels("conflict").inc()
        state = replace(
            state, owner=owner, refused_generation=generation, blocking=exc.keys,
            blocked=(status.REASON_NAME_CONFLICT, str(exc)),
        )  # fmt: skip
        return _announce_failure(rt, state, status.REASON_NAME_CONFLICT, str(exc)), None
    except _kube.NamespaceTerminatingError:
        raise
    except _kube.KubeError as exc:
        rt.metrics.reconciles.labels("error").inc()
        rt.metrics.errors.labels(type(exc).__name__).inc()
        if exc.status not in TRANSIENT_STATUSES or isinstance(exc, apply.MissingKindError):
            blocked = (status.REASON_APPLY_FAILED, f"the API server refused a child: {exc}")
            state = replace(state, owner=owner, blocking=frozenset(), blocked=blocked)
            if not exc.retryable:
                state = replace(state, refused_generation=generation)
        state = replace(_announce_failure(rt, state, "ApplyFailed", str(exc)), failed_applies=state.failed_applies + 1)
        backoff = min(RETRY_DELAY_S * 2 ** (state.failed_applies - 1), RETRY_MAX_S)
        return state, backoff if exc.retryable else None
    finally:
        rt.metrics.duration.observe(time.perf_counter() - began)
    _applied(rt, owner, candidate.objects, result)
    rt.metrics.reconciles.labels("changed" if result.changed else "unchanged").inc()
    # The sync listed and applied every child: nothing touched or waiting is left to repair.
    state = replace(
        state, owner=owner, desired=candidate, synced_generation=generation, refused_generation=None,
        blocked=None, blocking=frozenset(), failure="", failed_applies=0, waiting={},
    )  # fmt: skip
    return state, None


def _applied(rt: Runtime, owner: Owner, objects: list[dict[str, Any]], result: apply.SyncResult) -> None:
    """Keep the workloads' answers (status reads them before their watch events come); count, announce, log."""
    for obj in result.live:
        rt.world.remember(apply.key_of(obj), obj, watched=False)
    rt.metrics.set_objects((owner.namespace, owner.name), Counter(o["kind"] for o in objects))
    if result.changed:
        message = f"{len(result.written)} object(s) created or changed, {len(result.deleted)} pruned"
        rt.event(owner, "info", reason="Applied", message=message)
    log.info(
        "%s/%s generation %d: %d written, %d pruned, %d no-op applies, %d skipped",
        owner.namespace,
        owner.name,
        owner.generation,
        len(result.written),
        len(result.deleted),
        result.sent - len(result.written),
        result.skipped,
    )


def _announce_failure(rt: Runtime, state: DeploymentState, reason: str, message: str) -> DeploymentState:
    """A warning Event, unless it says what the last one did (a failure retried unchanged)."""
    if message == state.failure:
        return state
    rt.event(state.owner, "warn", reason, message)
    return replace(state, failure=message)


def _read(rt: Runtime, state: DeploymentState) -> DeploymentState:
    """Follow the master and the proxy the applied render has; their newest readings, and the Events a changed
    reading deserves."""
    derived = state.desired.derived if state.desired is not None else None
    readings: dict[str, Any] = {}
    for poll in POLLS:
        target = poll.target(rt.settings, derived)
        rt.polls.follow(state.key, poll, target)
        before = getattr(state, poll.slot)
        reading = rt.polls.reading(state.key, poll) if target is not None else None
        if target is None:
            readings[poll.slot] = None
        elif reading is None:
            readings[poll.slot] = before if before is not None else poll.unread  # kept until the first reading
        else:
            readings[poll.slot] = reading
            if reading != before:
                for notice in poll.notices(before, reading):
                    rt.event(state.owner, notice.level, notice.reason, notice.message)
    return replace(state, **readings)


def forget(rt: Runtime, state: DeploymentState) -> None:
    """The EPDDeployment is gone, or its namespace is going: drop what this process keeps for it (its children
    go through garbage collection)."""
    _release(rt, state)
    rt.world.forget(state.key)


def _release(rt: Runtime, state: DeploymentState) -> None:
    for poll in POLLS:
        rt.polls.follow(state.key, poll, None)
    if state.desired is not None:
        keys = [apply.key_of(o) for o in state.desired.objects]
        rt.applied.forget(state.owner.namespace, keys)
        rt.pacer.forget(keys)
    rt.metrics.forget(state.key)
