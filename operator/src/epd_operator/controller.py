"""The controller: watch events go into the world and enqueue their EPDDeployment; a work queue runs one reconcile
pass per deployment at a time (module reconcile) and keeps the state each pass returns.

As controller-runtime's watches enqueue a child's owner, a child's event enqueues the deployment that controls it
(and one whose apply it blocked by name); a model pod's, the deployment it serves; a reading that changed, the
deployment read. Events and readings come in bursts (a deployment's children created, its pods scheduled and
ready), so they enqueue after `STATUS_DELAY_S` and share one pass; a deletion, or a change to the deployment
itself, enqueues at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from epd_operator import _kube, apply, reconcile
from epd_operator.api import constants as c
from epd_operator.metrics import Metrics
from epd_operator.polling import Polls
from epd_operator.runtime import Runtime
from epd_operator.settings import Settings
from epd_operator.state import DeploymentState
from epd_operator.watches import Source, Watches
from epd_operator.workqueue import WorkQueue
from epd_operator.world import KEPT_KINDS, Key, World, owner_key

CHILD_SELECTOR = f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY},{c.LABEL_DEPLOYMENT}"
"""Server-side label selector of the child watches: ours, and belonging to some EPDDeployment."""
MODEL_POD_SELECTOR = f"{CHILD_SELECTOR},{c.LABEL_MODEL_REVISION}"
"""Of the pod watch: the model pods (encoder, prefill, decode, PD) of our deployments."""
MODEL_PODS = apply.Kind("v1", "Pod", "pods")
"""Watched for their revision gates; the workload controllers create them."""

STATUS_DELAY_S = 0.2
"""Events and readings this close together share one pass: a pass per event (the echo of each child applied,
each pod's step) cost the operator more than the wait costs."""


class Controller:
    def __init__(self, client: _kube.Client, settings: Settings, metrics: Metrics) -> None:
        world = World()
        self.queue: WorkQueue[Key] = WorkQueue(self._pass)
        polls = Polls(settings, world, lambda key: self.queue.add(key, STATUS_DELAY_S))
        self.runtime = Runtime(client, settings, metrics, world, polls)
        self.states: dict[Key, DeploymentState] = {}
        self.watches = Watches(client, self._sources(), listed=world.listed.add, gone=world.listed.discard)

    def _sources(self) -> list[Source]:
        """Every kind the operator creates, so that a child deleted or changed by hand is repaired at once (the
        kinds status never reads as metadata only), and the model pods, for their revision gates."""
        sources = [
            Source(kind, CHILD_SELECTOR, self._child_of(kind.kind), metadata_only=kind.kind not in KEPT_KINDS)
            for kind in apply.MANAGED_KINDS
        ]
        return [*sources, Source(MODEL_PODS, MODEL_POD_SELECTOR, self.pod_seen)]

    def _child_of(self, kind: str) -> Callable[[str | None, dict[str, Any]], None]:
        return lambda event_type, obj: self.child_seen(event_type, kind, obj)

    def start(self) -> None:
        """Start the watches of the children and model pods (in the running loop)."""
        settings = self.runtime.settings
        self.watches.start(settings.namespaces, settings.all_namespaces)

    def deployment_seen(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """An EPDDeployment was listed, added, changed or deleted."""
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if event_type == "DELETED":
            self.runtime.world.forget(key)
        else:
            if event_type == "ADDED":
                self.runtime.world.created.add(key)
            kept = {k: v for k, v in body["metadata"].items() if k != "managedFields"}  # never read
            self.runtime.world.deployments[key] = {
                "metadata": kept,
                "spec": body.get("spec"),
                "status": body.get("status"),
            }
        self.queue.add(key)

    def child_seen(self, event_type: str | None, kind: str, obj: dict[str, Any]) -> None:
        """A child of some EPDDeployment was listed, added, changed or deleted."""
        meta = obj.get("metadata", {})
        key = (kind, meta.get("namespace", ""), meta.get("name", ""))
        deleted = event_type == "DELETED"
        owners = [owner] if (owner := owner_key(meta)) is not None else []
        if deleted:
            owners += [k for k, state in self.states.items() if key in state.blocking and k not in owners]
        self.runtime.world.child_seen(deleted, key, obj, owners)
        delay = 0.0 if deleted else STATUS_DELAY_S
        for owner in owners:
            self.queue.add(owner, delay)

    def pod_seen(self, event_type: str | None, pod: Mapping[str, Any]) -> None:
        """A model pod came, changed or went: its revision may be complete now."""
        key = self.runtime.world.pod_seen(event_type == "DELETED", pod)
        if key is not None:
            self.queue.add(key, STATUS_DELAY_S)

    async def _pass(self, key: Key) -> float | None:
        try:
            state, again = await reconcile.reconcile(self.runtime, key, self.states.get(key))
        except Exception:
            self.runtime.metrics.errors.labels("Unexpected").inc()
            raise  # the queue logs it and comes back
        if state is None:
            self.states.pop(key, None)
        else:
            self.states[key] = state
        return again

    async def close(self) -> None:
        await self.watches.close()
        self.queue.close()
        self.runtime.polls.close()
        await self.runtime.client.close()
