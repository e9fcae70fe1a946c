"""The object the kopf handlers share: one process's state, and what happens to it (a spec to reconcile, a child
event to answer).

Every child kind is watched. A child event compares the object with what this process last applied
(`apply.Applied`: same render, and the fields we own still ours); only a deleted child or one someone changed
in a field we own is applied again (`repairs`), so the events of our own applies, status updates and other
managers' fields cost no request. A workload's events also feed its owner's status (`publish`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import kopf

from epd_operator import apply, gates, reconcile, repairs
from epd_operator.publish import publish_later
from epd_operator.state import State, Tracked, wanted


class Runtime(State):
    """The state of one operator process, and its two entry points."""

    async def reconcile(self, body: Mapping[str, Any]) -> None:
        """The spec is new or changed, or the operator restarted: see `reconcile.reconcile`; then the model pods'
        gates, as the render may need other roles now (or was missing when the pods were first seen)."""
        await reconcile.reconcile(self, body)
        meta = body["metadata"]
        tracked = self.deployments.get((meta["namespace"], meta["name"]))
        if tracked is not None:
            await gates.open_gates(self, tracked)

    async def pod_event(self, event_type: str | None, pod: dict[str, Any]) -> None:
        """A model pod changed or went: open the gates its deployment's pods now call for."""
        tracked = gates.pod_event(self, event_type, pod)
        if tracked is not None:
            await gates.open_gates(self, tracked)

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
                self.remember(key, obj, watched=True)
            elif self.workloads.get(key, {}).get("metadata", {}).get("uid") == meta.get("uid"):
                del self.workloads[key]
        tracked = self.owner_of(meta)
        want = wanted(tracked, key) if tracked is not None else None
        if tracked is None or want is None:
            return  # owner not reconciled yet (its handler applies everything), or a pruned or foreign child
        if kind in apply.WORKLOAD_KINDS:
            publish_later(self, tracked)
        if not deleted and (
            meta.get("deletionTimestamp") or self.applied.unchanged(want, apply.fingerprint(want), obj)
        ):
            return  # going (its DELETED event follows), or as we left it: our own apply, a status update...
        if not repairs.waiting(self, key):
            await repairs.repair(self, tracked, key, None if deleted else obj)

    def _retry_later(self, tracked: Tracked) -> None:
        """Reconcile `tracked` again (the object in its way is gone), from its last body."""
        if tracked.body is None:
            return
        body = tracked.body

        async def again() -> None:
            if not self.current(tracked):
                return  # forgotten meanwhile
            with contextlib.suppress(kopf.TemporaryError, kopf.PermanentError):  # reported; its next event retries
                await self.reconcile(body)

        self.spawn(again())
