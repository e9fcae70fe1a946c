"""What the kopf handlers share between calls, and the sequence each one runs (part of the handlers layer).

The operator remembers, per EPDDeployment, the last valid render (its workloads, derived values and
objects), why the current spec is invalid if it is, and the status it last wrote; and, per workload, the
last state the watch reported. With that, a workload event recomputes its owner's status without a single
read, and the status is written only when it differs from the last one (bursts of events share one write).
A restarted operator rebuilds all of it: the resume handler re-applies every EPDDeployment (no-ops for the
server) and takes the workloads from the answers, and the watches' initial listings fill in the rest. What is
lost with the process is the last valid render of a spec that is invalid now; status then reports its roles
as Unknown until the spec is fixed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from epd_operator import _kube, apply, status
from epd_operator.api import constants as c
from epd_operator.api.resource import InvalidSpecError, OperatorDefaults, Owner, parse_spec
from epd_operator.api.status import EPDDeploymentStatus
from epd_operator.metrics import Metrics
from epd_operator.render import Desired, render_desired

log = logging.getLogger(__name__)

Key = tuple[str, str]
"""(namespace, name) of an EPDDeployment."""

RETRY_DELAY_S = 5.0
"""Before kopf retries a reconcile the API server failed; its own backoff grows from there."""

STATUS_DELAY_S = 0.2
"""Workload events this close together share one status write: while a deployment comes up its workloads
report in bursts (created, scheduled, ready), and each write costs the API server more than the wait costs."""
RETRY_STATUS_S = 2.0
"""When a status write failed (API server busy), the next attempt."""

ANNOUNCED = frozenset({c.COND_VALID, c.COND_READY})
"""Conditions announced by an Event when they turn True; any condition is announced when it turns False."""


@dataclass
class Tracked:
    """One EPDDeployment as the operator knows it."""

    owner: Owner
    ref: kopf.Body
    """apiVersion, kind and metadata (name, namespace, uid): what Events need."""
    status: EPDDeploymentStatus
    """As last written (or read from the object when first seen)."""
    problems: list[str] = field(default_factory=list)
    desired: Desired | None = None
    """The last valid render; None until a spec was valid."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    pending: asyncio.Task[None] | None = None
    """A status refresh waiting for more workload events to coalesce with."""


def _owner(body: Mapping[str, Any]) -> Owner:
    meta = body["metadata"]
    return Owner(meta["name"], meta["namespace"], meta["uid"], int(meta.get("generation") or 1))


def _key(tracked: Tracked) -> Key:
    return tracked.owner.namespace, tracked.owner.name


def _trim(body: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a workload status reads (a watch body holds the whole pod template)."""
    meta = body.get("metadata", {})
    return {
        "metadata": {k: meta[k] for k in ("name", "uid", "generation", "deletionTimestamp") if k in meta},
        "spec": {"replicas": (body.get("spec") or {}).get("replicas", 1)},
        "status": dict(body.get("status") or {}),
    }


PostEvent = Callable[[str, kopf.Body, str, str], None]
"""(level "info" or "warn", the EPDDeployment, reason, message): posts a Kubernetes Event."""


def post_with_kopf(level: str, ref: kopf.Body, reason: str, message: str) -> None:
    (kopf.warn if level == "warn" else kopf.info)(ref, reason=reason, message=message)


class Runtime:
    """The state of one operator process."""

    def __init__(
        self,
        client: _kube.Client,
        defaults: OperatorDefaults,
        metrics: Metrics,
        concurrent_syncs: int,
    ) -> None:
        self.client, self.defaults, self.metrics = client, defaults, metrics
        # Fifty syncs at once all finish late (their requests interleave); a few at a time finish one after
        # another, so the pods of the first start while the rest are still being applied.
        self._syncs = asyncio.Semaphore(concurrent_syncs)
        self._tasks: set[asyncio.Task[None]] = set()
        self.post_event: PostEvent = post_with_kopf
        self.deployments: dict[Key, Tracked] = {}
        self.workloads: dict[tuple[str, str, str], dict[str, Any]] = {}
        """(kind, namespace, name) -> the workload as last seen."""
        self.applied = apply.Applied()

    def _event(self, tracked: Tracked, level: str, reason: str, message: str) -> None:
        self.post_event(level, tracked.ref, reason, message[:1000])

    def track(self, body: Mapping[str, Any]) -> Tracked:
        owner = _owner(body)
        key = (owner.namespace, owner.name)
        tracked = self.deployments.get(key)
        if tracked is None or tracked.owner.uid != owner.uid:  # new, or deleted and created again
            meta = body["metadata"]
            raw: kopf.RawBody = {
                "apiVersion": c.API_VERSION,
                "kind": c.KIND,
                "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
            }
            ref = kopf.Body(raw)
            tracked = Tracked(owner, ref, status.parse(body.get("status")))
            self.deployments[key] = tracked
        return tracked

    def _remember(self, key: tuple[str, str, str], body: Mapping[str, Any], *, watched: bool) -> None:
        """Keep the newest state of a workload, whichever path it came by.

        The watch and our own apply answers race: an answer may be processed after the watch already delivered
        a later state of the same object, and a lagging watch may deliver an older one after our answer. The
        generation orders them (it only grows for one object, uid): a watch event wins ties, since it carries
        the latest status; an apply or list answer counts only when it shows a generation not seen yet.
        """
        old = self.workloads.get(key)
        new_meta = body.get("metadata", {})
        if old is not None and old["metadata"].get("uid") == new_meta.get("uid"):
            before, after = int(old["metadata"].get("generation") or 0), int(new_meta.get("generation") or 0)
            if after < before or (after == before and not watched):
                return
        self.workloads[key] = _trim(body)

    def forget(self, namespace: str, name: str) -> None:
        """The EPDDeployment is gone (its children follow through garbage collection)."""
        tracked = self.deployments.pop((namespace, name), None)
        if tracked is not None and tracked.desired is not None:
            self.applied.forget(namespace, [apply.key_of(o) for o in tracked.desired.objects])
        self.metrics.forget((namespace, name))

    # -- reconcile

    async def reconcile(self, body: Mapping[str, Any]) -> None:
        """Parse, render, apply, prune, status. Raises kopf errors so kopf retries what may succeed later."""
        tracked = self.track(body)
        began = time.perf_counter()
        async with tracked.lock:
            try:
                outcome = await self._reconcile(tracked, _owner(body), body.get("spec") or {})
            except _kube.KubeError as exc:
                self.metrics.reconciles.labels("error").inc()
                self.metrics.errors.labels(type(exc).__name__).inc()
                self._event(tracked, "warn", reason="ApplyFailed", message=str(exc))
                if exc.retryable:
                    raise kopf.TemporaryError(str(exc), delay=RETRY_DELAY_S) from exc
                raise kopf.PermanentError(str(exc)) from exc
            except Exception:
                self.metrics.reconciles.labels("error").inc()
                self.metrics.errors.labels("Unexpected").inc()
                raise
            finally:
                self.metrics.duration.observe(time.perf_counter() - began)
        self.metrics.reconciles.labels(outcome).inc()

    async def _reconcile(self, tracked: Tracked, owner: Owner, raw_spec: dict[str, Any]) -> str:
        """The generation in `owner` becomes the one status reports only once it was acted on: applied, or
        found invalid (a failed apply leaves status at the previous one)."""
        try:
            desired = render_desired(owner, parse_spec(raw_spec), self.defaults)
        except InvalidSpecError as exc:
            tracked.owner = owner
            if exc.problems != tracked.problems:
                self._event(tracked, "warn", reason="InvalidSpec", message=str(exc))
            tracked.problems = list(exc.problems)
            self.metrics.errors.labels("InvalidSpec").inc()
            log.warning("%s/%s: invalid spec, children left as they are: %s", *_key(tracked), exc)
            await self.publish(tracked)
            return "invalid"
        if tracked.problems:
            self._event(tracked, "info", reason="SpecValid", message="the spec is valid again; applying it")
        tracked.problems = []
        async with self._syncs:
            result = await apply.sync(self.client, owner, desired.objects, self.applied)
        tracked.owner, tracked.desired = owner, desired
        for obj in result.live:
            if obj["kind"] in apply.WORKLOAD_KINDS:
                self._remember(apply.key_of(obj), obj, watched=False)
        self.metrics.set_objects(
            (tracked.owner.namespace, tracked.owner.name), Counter(o["kind"] for o in desired.objects)
        )
        if result.changed:
            message = f"{len(result.written)} object(s) created or changed, {len(result.deleted)} pruned"
            self._event(tracked, "info", reason="Applied", message=message)
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
        await self.publish(tracked)
        return "changed" if result.changed else "unchanged"

    # -- status

    async def publish(self, tracked: Tracked) -> None:
        """Recompute the status from what is known; write it only if it changed. Call with the lock held."""
        owner, desired = tracked.owner, tracked.desired
        observed = None
        if desired is not None:
            observed = [
                status.observe(w, self.workloads.get((w.kind, owner.namespace, w.name))) for w in desired.workloads
            ]
        facts = status.Facts(
            generation=owner.generation,
            problems=tracked.problems,
            observed=observed,
            derived=desired.derived if desired is not None else None,
            previous=tracked.status,
            now=status.now(),
        )
        new = status.compute(facts)
        if new == tracked.status:
            return
        if not await status.write(self.client, owner.namespace, owner.name, new):
            return  # deleted meanwhile
        self.metrics.status_writes.inc()
        self.metrics.set_phase((owner.namespace, owner.name), new.phase)
        first = not tracked.status.conditions  # a new object starts not ready: nothing to announce
        for flipped in status.flips(tracked.status, new):
            event = f"{flipped.type} is {flipped.status}: {flipped.message}"[:1000]
            if flipped.status == "True" and flipped.type in ANNOUNCED:
                self._event(tracked, "info", reason=flipped.type, message=event)
            elif flipped.status == "False" and not first and flipped.type != c.COND_VALID:  # InvalidSpec said it
                if flipped.reason in status.PROGRESS_REASONS:
                    self._event(tracked, "info", reason=flipped.reason, message=event)
                else:
                    self._event(tracked, "warn", reason=flipped.reason, message=event)
        tracked.status = new

    async def workload_event(self, event_type: str | None, kind: str, body: Mapping[str, Any]) -> None:
        """A watched workload changed: remember it, and refresh its owner's status (or recreate it if deleted)."""
        meta = body.get("metadata", {})
        namespace, name = meta.get("namespace", ""), meta.get("name", "")
        key = (kind, namespace, name)
        if event_type != "DELETED":
            self._remember(key, body, watched=True)
        elif self.workloads.get(key, {}).get("metadata", {}).get("uid") == meta.get("uid"):
            del self.workloads[key]
        owner_name = (meta.get("labels") or {}).get(c.LABEL_DEPLOYMENT)
        tracked = self.deployments.get((namespace, owner_name or ""))
        if tracked is None or tracked.desired is None:
            return  # not seen yet: its resume or create handler publishes once it ran
        if not any(w.kind == kind and w.name == name for w in tracked.desired.workloads):
            return  # a pruned or foreign workload
        if event_type != "DELETED":
            self._refresh_later(tracked)
            return
        async with tracked.lock:
            if self.deployments.get(_key(tracked)) is not tracked:
                return
            owner = tracked.owner
            if not await status.exists(self.client, owner.namespace, owner.name, owner.uid):
                self.forget(owner.namespace, owner.name)  # the owner is going: GC deletes its children
                return
            try:
                await self._restore(tracked)
            except _kube.KubeError as exc:  # the next event or reconcile tries again
                self._event(tracked, "warn", reason="RestoreFailed", message=str(exc))
        self._refresh_later(tracked)

    def _refresh_later(self, tracked: Tracked, delay: float = STATUS_DELAY_S) -> None:
        """Publish the status after `delay`, once for every event that arrives meanwhile."""
        if tracked.pending is None or tracked.pending.done():
            tracked.pending = task = asyncio.create_task(self._refresh(tracked, delay))
            self._tasks.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(self._tasks.discard)

    async def _refresh(self, tracked: Tracked, delay: float) -> None:
        await asyncio.sleep(delay)
        tracked.pending = None  # events from here on schedule another refresh
        async with tracked.lock:
            if self.deployments.get(_key(tracked)) is not tracked:
                return  # forgotten meanwhile
            try:
                await self.publish(tracked)
            except _kube.KubeError as exc:
                log.warning("%s/%s: status not written, retrying: %s", *_key(tracked), exc)
                self._refresh_later(tracked, RETRY_STATUS_S)

    async def _restore(self, tracked: Tracked) -> None:
        """Someone deleted a workload of a live EPDDeployment: apply the last valid render again."""
        if tracked.desired is None:
            return
        result = await apply.sync(self.client, tracked.owner, tracked.desired.objects, self.applied)
        if result.written:
            self._event(
                tracked, "warn", reason="Restored", message=f"recreated {len(result.written)} deleted object(s)"
            )
