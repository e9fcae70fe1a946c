"""Reconcile one EPDDeployment: get it, render its children, apply them, publish its status.

A spec whose children cannot be applied (another EPDDeployment holds one of their names, or the API server
refuses one) is reported in Ready with the reason and the server's message, for the generation it concerns. A
name conflict is tried again when the object in the way is deleted (its watch event), or when the spec changes.
"""

from __future__ import annotations

import copy
import logging
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import kopf

from epd_operator import _kube, apply, polling, status, store_watch, transfer_watch
from epd_operator.api.resource import InvalidSpecError, Owner, parse_spec
from epd_operator.publish import publish
from epd_operator.render import Desired, render_desired
from epd_operator.state import State, Tracked, owner_of_body

log = logging.getLogger(__name__)

RETRY_DELAY_S = 5.0
"""Before kopf retries a reconcile the API server failed; its own backoff grows from there."""

TRANSIENT_STATUSES = frozenset({0, 404, 409, 429, 502, 503, 504})
"""API answers that say nothing about the object sent (no answer, busy, a race, a cache not caught up yet):
retried without a word in status. Any other failure is the server refusing what we sent (400, 422, a 500
from a value it cannot store, a 403 of missing RBAC), and Ready reports it."""


async def reconcile(state: State, body: Mapping[str, Any]) -> None:
    """Get, render, apply, status. Raises kopf errors so kopf retries what may succeed later."""
    tracked = state.track(body)
    tracked.body = {"metadata": dict(body["metadata"]), "spec": copy.deepcopy(dict(body.get("spec") or {}))}
    began = time.perf_counter()
    async with tracked.lock:
        try:
            outcome = await _reconcile(state, tracked, owner_of_body(body), body.get("spec") or {})
        except _kube.NamespaceTerminatingError:
            state.leave_alone(tracked)
            return
        except _kube.KubeError as exc:
            state.metrics.reconciles.labels("error").inc()
            state.metrics.errors.labels(type(exc).__name__).inc()
            state.announce_failure(tracked, "ApplyFailed", str(exc))
            if exc.retryable:
                raise kopf.TemporaryError(str(exc), delay=RETRY_DELAY_S) from exc
            raise kopf.PermanentError(str(exc)) from exc
        except Exception:
            state.metrics.reconciles.labels("error").inc()
            state.metrics.errors.labels("Unexpected").inc()
            raise
        finally:
            state.metrics.duration.observe(time.perf_counter() - began)
    state.metrics.reconciles.labels(outcome).inc()


async def _reconcile(state: State, tracked: Tracked, owner: Owner, raw_spec: dict[str, Any]) -> str:
    """The outcome, for the metrics. The generation in `owner` becomes the one status reports only once it
    was acted on: applied, or found invalid (a failed apply leaves status at the previous one)."""
    desired = _render(state, tracked, owner, raw_spec)
    if desired is None:
        await publish(state, tracked)
        return "invalid"
    result = await _apply(state, tracked, owner, desired)
    if result is None:
        await publish(state, tracked)
        return "conflict"
    _applied(state, tracked, owner, desired, result)
    await publish(state, tracked)
    return "changed" if result.changed else "unchanged"


def _render(state: State, tracked: Tracked, owner: Owner, raw_spec: dict[str, Any]) -> Desired | None:
    """The children of the spec; None when it is invalid (its problems then go to status, children untouched)."""
    try:
        desired = render_desired(owner, parse_spec(raw_spec), state.defaults)
    except InvalidSpecError as exc:
        tracked.owner = owner
        if exc.problems != tracked.problems:
            state.event(tracked, "warn", reason="InvalidSpec", message=str(exc))
        tracked.problems = list(exc.problems)
        state.metrics.errors.labels("InvalidSpec").inc()
        log.warning("%s/%s: invalid spec, children left as they are: %s", *tracked.key, exc)
        return None
    if tracked.problems:
        state.event(tracked, "info", reason="SpecValid", message="the spec is valid again; applying it")
    tracked.problems = []
    return desired


async def _apply(state: State, tracked: Tracked, owner: Owner, desired: Desired) -> apply.SyncResult | None:
    """Apply and prune the children; None when a name conflict stopped it before anything was sent."""
    try:
        async with state.syncs:
            return await apply.sync(state.client, owner, desired.objects, state.applied)
    except apply.NameConflictError as exc:
        tracked.owner, tracked.blocked, tracked.blocking = owner, (status.REASON_NAME_CONFLICT, str(exc)), exc.keys
        log.warning("%s/%s: name conflict, nothing applied: %s", *tracked.key, exc)
        state.announce_failure(tracked, status.REASON_NAME_CONFLICT, str(exc))
        state.metrics.errors.labels("NameConflict").inc()
        return None
    except _kube.KubeError as exc:
        if exc.status not in TRANSIENT_STATUSES and not isinstance(exc, _kube.NamespaceTerminatingError):
            tracked.owner, tracked.blocking = owner, frozenset()
            tracked.blocked = (status.REASON_APPLY_FAILED, f"the API server refused a child: {exc}")
            try:
                await publish(state, tracked)
            except _kube.KubeError as also:  # the original failure is the one to raise
                log.warning("%s/%s: status not written: %s", *tracked.key, also)
        raise


def _applied(state: State, tracked: Tracked, owner: Owner, desired: Desired, result: apply.SyncResult) -> None:
    """Remember the render and the workloads' answers; count, announce and log what changed."""
    tracked.owner, tracked.desired = owner, desired
    tracked.blocked, tracked.blocking, tracked.failure = None, frozenset(), ""
    for obj in result.live:
        state.remember(apply.key_of(obj), obj, watched=False)
    state.metrics.set_objects(tracked.key, Counter(o["kind"] for o in desired.objects))
    polling.follow(state, tracked, store_watch.POLL)
    polling.follow(state, tracked, transfer_watch.POLL)
    if result.changed:
        message = f"{len(result.written)} object(s) created or changed, {len(result.deleted)} pruned"
        state.event(tracked, "info", reason="Applied", message=message)
    log.info(
        "%s/%s generation %d: %d written, %d pruned, %d no-op applies, %d skipped",
        tracked.owner.namespace,
        tracked.owner.name,
        tracked.owner.generation,
        len(result.written),
        len(result.deleted),
        result.sent - len(result.written),
        result.skipped,
    )
