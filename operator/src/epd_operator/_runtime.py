"""What the kopf handlers share between calls, and the sequence each one runs (part of the handlers layer).

The operator remembers, per EPDDeployment, the last valid render (its workloads, derived values and
objects), why the current spec is invalid if it is, and the status it last wrote; and, per workload, the
last state the watch reported. With that, a workload event recomputes its owner's status without a single
read, and the status is written only when it differs from the last one (bursts of events share one write).

Every child kind is watched. A child event compares the object with what this process last applied
(`apply.Applied`: same render, and the fields we own still ours); only a deleted child or one someone changed
in a field we own is applied again, so the events of our own applies, status updates and other managers'
fields cost no request. Repairs of one child are paced (`pacing`), so a writer that keeps undoing ours does not
turn into a tight loop of writes.

A spec whose children cannot be applied (another EPDDeployment holds one of their names, or the API server
refuses one) is reported in Ready with the reason and the server's message, for the generation it concerns. A
name conflict is tried again when the object in the way is deleted (its watch event), or when the spec changes.
Once the namespace is being deleted, the operator leaves its deployments alone: no repair, no Event.

A restarted operator rebuilds all of it: the resume handler re-applies every EPDDeployment (no-ops for the
server) and takes the workloads from the answers, and the watches' initial listings fill in the rest. What is
lost with the process is the last valid render of a spec that is invalid now; status then reports its roles
as Unknown until the spec is fixed (and its children are not repaired meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from epd_operator import _kube, apply, events, managed_fields, pacing, status
from epd_operator.api import constants as c
from epd_operator.api.resource import InvalidSpecError, OperatorDefaults, Owner, parse_spec
from epd_operator.api.status import EPDDeploymentStatus
from epd_operator.metrics import Metrics
from epd_operator.render import Desired, render_desired

log = logging.getLogger(__name__)

Key = tuple[str, str]
"""(namespace, name) of an EPDDeployment."""
ChildKey = tuple[str, str, str]
"""(kind, namespace, name) of a child, as `apply.key_of` makes it."""

RETRY_DELAY_S = 5.0
"""Before kopf retries a reconcile the API server failed; its own backoff grows from there."""

STATUS_DELAY_S = 0.2
"""Workload events this close together share one status write: while a deployment comes up its workloads
report in bursts (created, scheduled, ready), and each write costs the API server more than the wait costs."""
RETRY_STATUS_S = 2.0
"""When a status write failed (API server busy), the next attempt."""

RETRY_REPAIR_S = 5.0
"""When a repair failed with an error worth retrying (API server busy), the next attempt."""

TRANSIENT_STATUSES = frozenset({0, 404, 409, 429, 502, 503, 504})
"""API answers that say nothing about the object sent (no answer, busy, a race, a cache not caught up yet):
retried without a word in status. Any other failure is the server refusing what we sent (400, 422, a 500
from a value it cannot store, a 403 of missing RBAC), and Ready reports it."""

ANNOUNCED = frozenset({c.COND_VALID, c.COND_READY})
"""Conditions announced by an Event when they turn True; any condition is announced when it turns False."""


@dataclass
class Tracked:
    """One EPDDeployment as the operator knows it."""

    owner: Owner
    status: EPDDeploymentStatus
    """As last written (or read from the object when first seen)."""
    problems: list[str] = field(default_factory=list)
    desired: Desired | None = None
    """The last valid render; None until a spec was valid."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    pending: asyncio.Task[None] | None = None
    """A status refresh waiting for more workload events to coalesce with."""
    blocked: tuple[str, str] | None = None
    """(reason, message) when the current spec's children could not be applied (status.Facts.blocked)."""
    blocking: frozenset[ChildKey] = frozenset()
    """The objects of other EPDDeployments in the way (a name conflict): their deletion retries the reconcile."""
    body: dict[str, Any] | None = None
    """metadata and spec as last reconciled, for that retry."""
    failure: str = ""
    """The message of the last ApplyFailed Event, so a failure retried unchanged is announced once."""


def _owner(body: Mapping[str, Any]) -> Owner:
    meta = body["metadata"]
    return Owner(meta["name"], meta["namespace"], meta["uid"], int(meta.get("generation") or 1))


def _key(tracked: Tracked) -> Key:
    return tracked.owner.namespace, tracked.owner.name


def _wanted(tracked: Tracked, key: ChildKey) -> dict[str, Any] | None:
    """The child `key` as the last valid render has it; None when that render has no such child."""
    if tracked.desired is None:
        return None
    return next((o for o in tracked.desired.objects if apply.key_of(o) == key), None)


def _trim(body: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a workload status reads (a watch body holds the whole pod template)."""
    meta = body.get("metadata", {})
    return {
        "metadata": {k: meta[k] for k in ("name", "uid", "generation", "deletionTimestamp") if k in meta},
        "spec": {"replicas": (body.get("spec") or {}).get("replicas", 1)},
        "status": dict(body.get("status") or {}),
    }


PostEvent = Callable[[str, Owner, str, str], None]
"""(level "info" or "warn", the EPDDeployment, reason, message): posts a Kubernetes Event."""


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
        self.events = events.EventPoster(client)
        self.post_event: PostEvent = self.events.post
        self.deployments: dict[Key, Tracked] = {}
        self.workloads: dict[ChildKey, dict[str, Any]] = {}
        """(kind, namespace, name) -> the workload as last seen."""
        self.applied = apply.Applied()
        self.pacer = pacing.Pacer()
        self._repairs: dict[ChildKey, asyncio.Task[None]] = {}
        """Repairs waiting for their turn (`pacer`), one per child at most."""

    def _event(self, tracked: Tracked, level: str, reason: str, message: str) -> None:
        self.post_event(level, tracked.owner, reason, message)

    def _announce_failure(self, tracked: Tracked, reason: str, message: str) -> None:
        """A warning Event, unless it says what the last one did (kopf retries a failure unchanged)."""
        if message != tracked.failure:
            self._event(tracked, "warn", reason=reason, message=message)
            tracked.failure = message

    def _leave_alone(self, tracked: Tracked) -> None:
        """The namespace is being deleted: re-creating children or posting Events there only fails."""
        log.info("%s/%s: the namespace is being deleted; leaving it alone", *_key(tracked))
        self.forget(*_key(tracked))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)
        return task

    def track(self, body: Mapping[str, Any]) -> Tracked:
        owner = _owner(body)
        key = (owner.namespace, owner.name)
        tracked = self.deployments.get(key)
        if tracked is None or tracked.owner.uid != owner.uid:  # new, or deleted and created again
            tracked = Tracked(owner, status.parse(body.get("status")))
            self.deployments[key] = tracked
            if tracked.status.conditions:  # written before (by an earlier process): counts until we write again
                self.metrics.set_phase(key, tracked.status.phase)
        return tracked

    def _remember(self, key: ChildKey, body: Mapping[str, Any], *, watched: bool) -> None:
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
            keys = [apply.key_of(o) for o in tracked.desired.objects]
            self.applied.forget(namespace, keys)
            self.pacer.forget(keys)
        self.metrics.forget((namespace, name))

    # -- reconcile

    async def reconcile(self, body: Mapping[str, Any]) -> None:
        """Parse, render, apply, prune, status. Raises kopf errors so kopf retries what may succeed later."""
        tracked = self.track(body)
        tracked.body = {"metadata": dict(body["metadata"]), "spec": copy.deepcopy(dict(body.get("spec") or {}))}
        began = time.perf_counter()
        async with tracked.lock:
            try:
                outcome = await self._reconcile(tracked, _owner(body), body.get("spec") or {})
            except _kube.NamespaceTerminatingError:
                self._leave_alone(tracked)
                return
            except _kube.KubeError as exc:
                self.metrics.reconciles.labels("error").inc()
                self.metrics.errors.labels(type(exc).__name__).inc()
                self._announce_failure(tracked, "ApplyFailed", str(exc))
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
        try:
            async with self._syncs:
                result = await apply.sync(self.client, owner, desired.objects, self.applied)
        except apply.NameConflictError as exc:
            tracked.owner, tracked.blocked, tracked.blocking = owner, (status.REASON_NAME_CONFLICT, str(exc)), exc.keys
            log.warning("%s/%s: name conflict, nothing applied: %s", *_key(tracked), exc)
            self._announce_failure(tracked, status.REASON_NAME_CONFLICT, str(exc))
            self.metrics.errors.labels("NameConflict").inc()
            await self.publish(tracked)
            return "conflict"
        except _kube.KubeError as exc:
            if exc.status not in TRANSIENT_STATUSES and not isinstance(exc, _kube.NamespaceTerminatingError):
                tracked.owner, tracked.blocking = owner, frozenset()
                tracked.blocked = (status.REASON_APPLY_FAILED, f"the API server refused a child: {exc}")
                try:
                    await self.publish(tracked)
                except _kube.KubeError as also:  # the original failure is the one to raise
                    log.warning("%s/%s: status not written: %s", *_key(tracked), also)
            raise
        tracked.owner, tracked.desired = owner, desired
        tracked.blocked, tracked.blocking, tracked.failure = None, frozenset(), ""
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
            blocked=tracked.blocked,
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

    async def child_event(self, event_type: str | None, kind: str, obj: dict[str, Any]) -> None:
        """A watched child changed or went: a workload's state feeds its owner's status, and a child that was
        deleted, or changed in a field we own, is applied again from the last valid render."""
        meta = obj.get("metadata", {})
        key = (kind, meta.get("namespace", ""), meta.get("name", ""))
        deleted = event_type == "DELETED"
        if deleted:
            for blocked in [t for t in self.deployments.values() if key in t.blocking]:
                blocked.blocking = frozenset()  # one retry per conflict: it finds any that remain
                self._retry_later(blocked)
        if kind in apply.WORKLOAD_KINDS:
            if not deleted:
                self._remember(key, obj, watched=True)
            elif self.workloads.get(key, {}).get("metadata", {}).get("uid") == meta.get("uid"):
                del self.workloads[key]
        tracked = self._owner_of(meta)
        wanted = _wanted(tracked, key) if tracked is not None else None
        if tracked is None or wanted is None:
            return  # owner not reconciled yet (its handler applies everything), or a pruned or foreign child
        if kind in apply.WORKLOAD_KINDS:
            self._refresh_later(tracked)
        if not deleted and (
            meta.get("deletionTimestamp") or self.applied.unchanged(wanted, apply.fingerprint(wanted), obj)
        ):
            return  # going (its DELETED event follows), or as we left it: our own apply, a status update...
        if key not in self._repairs:  # else one waits for its turn, and applies the render as it is then
            await self._repair(tracked, key, None if deleted else obj)

    def _owner_of(self, meta: Mapping[str, Any]) -> Tracked | None:
        """The tracked EPDDeployment a child belongs to: its controller, or (reference removed by hand) its label."""
        namespace = meta.get("namespace", "")
        for ref in meta.get("ownerReferences") or []:
            if ref.get("controller") and ref.get("kind") == c.KIND:
                tracked = self.deployments.get((namespace, ref.get("name", "")))
                return tracked if tracked is not None and tracked.owner.uid == ref.get("uid") else None
        return self.deployments.get((namespace, (meta.get("labels") or {}).get(c.LABEL_DEPLOYMENT, "")))

    async def _repair(self, tracked: Tracked, key: ChildKey, live: dict[str, Any] | None, paced: bool = False) -> None:
        """Apply one child of the last valid render again: it was deleted (`live` None) or changed by hand.
        Unless `paced` (its turn came), the pacer may put it off."""
        async with tracked.lock:
            wanted = _wanted(tracked, key)  # again: a reconcile may have changed or pruned it meanwhile
            if self.deployments.get(_key(tracked)) is not tracked or wanted is None:
                return
            digest = apply.fingerprint(wanted)
            if live is not None and self.applied.unchanged(wanted, digest, live):
                return  # the event was the echo of a reconcile's apply, which held the lock
            if not paced and (delay := self.pacer.wait(key, time.monotonic())) > 0:
                self._repair_later(tracked, key, live, delay)
                return
            owner = tracked.owner
            if live is None and not await status.exists(self.client, owner.namespace, owner.name, owner.uid):
                self.forget(owner.namespace, owner.name)  # the owner is going: GC deletes its children
                return
            try:
                # What the server holds just before our apply: when our managedFields entry is the same in the
                # answer, the apply was a no-op (an event that was already stale: a controller's write between an
                # edit and its repair). Not the resourceVersion: a controller's status write may move it meanwhile.
                before = None if live is None else await apply.current(self.client, wanted)
                answers = await apply.apply(self.client, wanted, live)
            except _kube.NamespaceTerminatingError:
                self._leave_alone(tracked)
                return
            except _kube.KubeError as exc:
                self._event(tracked, "warn", reason="RepairFailed", message=f"{key[0]} {key[2]}: {exc}")
                if exc.retryable:
                    self._repair_later(tracked, key, live, RETRY_REPAIR_S)
                return
            after = answers[-1]
            written = before is None or managed_fields.held(after) != managed_fields.held(before)
            self.applied.record(wanted, digest, answers)
            if key[0] in apply.WORKLOAD_KINDS:
                self._remember(key, after, watched=False)
        cause = "deleted" if live is None else "changed in a field the operator owns"
        outcome = "written" if written else "no-op"
        log.info("%s/%s: %s %s was %s; applied again (%s)", *_key(tracked), *key[::2], cause, outcome)
        if written:
            self.metrics.repairs.labels(key[0], "deleted" if live is None else "changed").inc()
            reason = "Restored" if live is None else "Reverted"
            self._event(tracked, "warn", reason=reason, message=f"{key[0]} {key[2]} was {cause}; applied it again")

    def _repair_later(self, tracked: Tracked, key: ChildKey, live: dict[str, Any] | None, delay: float) -> None:
        """Repair `key` after `delay`, once however many events arrive meanwhile."""
        if key in self._repairs:
            return

        async def later() -> None:
            await asyncio.sleep(delay)
            self._repairs.pop(key, None)  # events from here on may ask for another repair
            await self._repair(tracked, key, live, paced=True)

        self._repairs[key] = self._spawn(later())

    def _retry_later(self, tracked: Tracked) -> None:
        """Reconcile `tracked` again (the object in its way is gone), from its last body."""
        if tracked.body is None:
            return
        body = tracked.body

        async def again() -> None:
            if self.deployments.get(_key(tracked)) is not tracked:
                return  # forgotten meanwhile
            with contextlib.suppress(kopf.TemporaryError, kopf.PermanentError):  # reported; its next event retries
                await self.reconcile(body)

        self._spawn(again())

    def _refresh_later(self, tracked: Tracked, delay: float = STATUS_DELAY_S) -> None:
        """Publish the status after `delay`, once for every event that arrives meanwhile."""
        if tracked.pending is None or tracked.pending.done():
            tracked.pending = self._spawn(self._refresh(tracked, delay))

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
