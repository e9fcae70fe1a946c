"""What one operator process remembers between handler calls, and the small acts every step shares.

Per EPDDeployment: the last valid render (workloads, derived values, objects), why the current spec is invalid
if it is, and the status last written; per workload: the last state seen. With that, a workload event
recomputes its owner's status without a read, and status is written only when it differs.

A restarted operator rebuilds all of it: the resume handler re-applies every EPDDeployment (no-ops for the
server) and takes the workloads from the answers, and the watches' initial listings fill in the rest. Lost with
the process is the last valid render of a spec that is invalid now: its roles read Unknown (and its children
go unrepaired) until the spec is fixed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from epd_operator import _kube, apply, events, pacing, status
from epd_operator.api import constants as c
from epd_operator.api.resource import OperatorDefaults, Owner
from epd_operator.api.status import EPDDeploymentStatus, StoreStatus, TransferStatus
from epd_operator.metrics import Metrics
from epd_operator.render import Desired
from epd_operator.revision_gate import ModelPod
from epd_operator.settings import Settings

log = logging.getLogger(__name__)

Key = tuple[str, str]
"""(namespace, name) of an EPDDeployment."""
ChildKey = tuple[str, str, str]
"""(kind, namespace, name) of a child, as `apply.key_of` makes it."""

PostEvent = Callable[[str, Owner, str, str], None]
"""(level "info" or "warn", the EPDDeployment, reason, message): posts a Kubernetes Event."""


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
    store: StoreStatus | None = None
    """The store master's last report (store_watch); None without a store or while it is not read."""
    transfers: TransferStatus | None = None
    """The proxy's last canary report (transfer_watch); None without a proxy or while it is not read."""
    polls: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    """The tasks reading the master and the proxy (module polling), by the attribute each one fills."""

    @property
    def key(self) -> Key:
        return self.owner.namespace, self.owner.name


def owner_of_body(body: Mapping[str, Any]) -> Owner:
    meta = body["metadata"]
    return Owner(meta["name"], meta["namespace"], meta["uid"], int(meta.get("generation") or 1))


def wanted(tracked: Tracked, key: ChildKey) -> dict[str, Any] | None:
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


class State:
    """The memory of one operator process, and its client, metrics and Events."""

    def __init__(self, client: _kube.Client, settings: Settings, metrics: Metrics) -> None:
        self.client, self.settings, self.metrics = client, settings, metrics
        # Fifty syncs at once all finish late (their requests interleave); a few at a time finish one after
        # another, so the pods of the first start while the rest are still being applied.
        self.syncs = asyncio.Semaphore(settings.concurrent_reconciles)
        self._tasks: set[asyncio.Task[None]] = set()
        self.events = events.EventPoster(client)
        self.post_event: PostEvent = self.events.post
        self.deployments: dict[Key, Tracked] = {}
        self.workloads: dict[ChildKey, dict[str, Any]] = {}
        """(kind, namespace, name) -> the workload as last seen."""
        self.applied = apply.Applied()
        self.pacer = pacing.Pacer()
        self.model_pods: dict[Key, dict[str, ModelPod]] = {}
        """Per EPDDeployment, its model pods by name as the pod watch last showed them (module gates)."""
        self.pending_repairs: dict[ChildKey, asyncio.Task[None]] = {}
        """Repairs waiting for their turn (`pacer`), one per child at most (module `repairs`)."""

    @property
    def defaults(self) -> OperatorDefaults:
        return self.settings.defaults

    def track(self, body: Mapping[str, Any]) -> Tracked:
        owner = owner_of_body(body)
        key = (owner.namespace, owner.name)
        tracked = self.deployments.get(key)
        if tracked is None or tracked.owner.uid != owner.uid:  # new, or deleted and created again
            tracked = Tracked(owner, status.parse(body.get("status")))
            # Kept until the first reading, so a restart does not blank them.
            tracked.store, tracked.transfers = tracked.status.store, tracked.status.transfers
            self.deployments[key] = tracked
            if tracked.status.conditions:  # written by an earlier process: counts until we write again
                self.metrics.set_phase(key, tracked.status.phase)
        return tracked

    def current(self, tracked: Tracked) -> bool:
        """Whether `tracked` is still the one remembered (not forgotten, nor replaced by a namesake)."""
        return self.deployments.get(tracked.key) is tracked

    def owner_of(self, meta: Mapping[str, Any]) -> Tracked | None:
        """The tracked EPDDeployment a child belongs to: its controller, or (reference removed by hand) its label."""
        namespace = meta.get("namespace", "")
        for ref in meta.get("ownerReferences") or []:
            if ref.get("controller") and ref.get("kind") == c.KIND:
                tracked = self.deployments.get((namespace, ref.get("name", "")))
                return tracked if tracked is not None and tracked.owner.uid == ref.get("uid") else None
        return self.deployments.get((namespace, (meta.get("labels") or {}).get(c.LABEL_DEPLOYMENT, "")))

    def remember(self, key: ChildKey, body: Mapping[str, Any], *, watched: bool) -> None:
        """Keep the newest state of child `key` if it is a workload (status reads no other kind).

        The watch and our own apply answers race, either may arrive late. The generation orders them (it only
        grows for one uid): a watch event wins ties, since it carries the latest status; an apply or list answer
        counts only when it shows a generation not seen yet.
        """
        if key[0] not in apply.WORKLOAD_KINDS:
            return
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
        self.model_pods.pop((namespace, name), None)
        for task in tracked.polls.values() if tracked is not None else ():
            task.cancel()
        if tracked is not None and tracked.desired is not None:
            keys = [apply.key_of(o) for o in tracked.desired.objects]
            self.applied.forget(namespace, keys)
            self.pacer.forget(keys)
        self.metrics.forget((namespace, name))

    def leave_alone(self, tracked: Tracked) -> None:
        """The namespace is being deleted: re-creating children or posting Events there only fails."""
        log.info("%s/%s: the namespace is being deleted; leaving it alone", *tracked.key)
        self.forget(*tracked.key)

    def event(self, tracked: Tracked, level: str, reason: str, message: str) -> None:
        self.post_event(level, tracked.owner, reason, message)

    def announce_failure(self, tracked: Tracked, reason: str, message: str) -> None:
        """A warning Event, unless it says what the last one did (kopf retries a failure unchanged)."""
        if message != tracked.failure:
            self.event(tracked, "warn", reason=reason, message=message)
            tracked.failure = message

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)
        return task
