"""The kopf handlers: start and stop the controller, and pass every EPDDeployment kopf sees to it, which keeps it
and enqueues the deployment.

They go into a registry of their own (`registry`), which `main` hands to kopf, so kopf's global one is never
touched. Every handler is an event handler: kopf keeps no state of its own on our objects (no annotations, no
finalizer; owner references let the garbage collector delete the children). The children and model pods are
watched by the controller itself (module watches), except with peering: kopf pauses every watch of its own
while a peer leads, which the controller's watches could not know, so there kopf watches them too and passes
their events on, as it does the deployments'.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from epd_operator import _kube, apply
from epd_operator.api import constants as c
from epd_operator.controller import CHILD_SELECTOR, MODEL_POD_SELECTOR, Controller
from epd_operator.metrics import Metrics
from epd_operator.settings import Settings

_CHILD_LABELS: Mapping[str, Any] = {c.LABEL_MANAGED_BY: c.MANAGED_BY, c.LABEL_DEPLOYMENT: kopf.PRESENT}
_MODEL_POD_LABELS: Mapping[str, Any] = {**_CHILD_LABELS, c.LABEL_MODEL_REVISION: kopf.PRESENT}

IDLE_WORKER_S = 0.5
"""How long kopf keeps an object's worker, and with it the object's last body, after its last event (5 s by
default: fifty deployments coming up at once kept thousands of bodies, the operator's peak memory). Our handlers
only enqueue, so a new worker costs little."""


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf keeps no diff base: every handler here is an event handler, which never reads one, and building it
    deep-copied every watched body (a tenth of the operator's CPU with fifty deployments coming up at once)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def configure(settings: kopf.OperatorSettings) -> None:
    """Our kopf settings: no diff base, idle workers gone soon, child watches (with peering) filtered on the
    server by label, Events under our name."""
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.queueing.idle_timeout = IDLE_WORKER_S
    for kind in apply.MANAGED_KINDS:
        settings.watching.label_selectors[kind.api_version, kind.plural] = CHILD_SELECTOR
    settings.watching.label_selectors["v1", "pods"] = MODEL_POD_SELECTOR
    settings.posting.reporting_component = c.MANAGED_BY


async def login(memo: Any, **_: Any) -> kopf.ConnectionInfo:
    """kopf connects as our own client does (same server, same identity, read again when it expires)."""
    controller: Controller = memo.controller
    return await controller.runtime.client.credentials()


async def startup(memo: Any, **_: Any) -> None:
    """Connect, share one Controller with every handler (kopf copies the memo's attributes per resource), and
    start its watches."""
    settings: Settings = memo.settings
    metrics: Metrics = memo.metrics
    memo.controller = Controller(await _kube.Client.connect(settings.connection), settings, metrics)
    if settings.peering is None:
        memo.controller.start()


async def cleanup(memo: Any, **_: Any) -> None:
    controller: Controller | None = getattr(memo, "controller", None)
    if controller is not None:
        await controller.close()


async def deployment_event(event: Any, memo: Any, **_: Any) -> None:
    """Async, as every handler here: kopf runs a plain function in a thread, away from the controller's loop."""
    controller: Controller = memo.controller
    controller.deployment_seen(event["type"], event["object"])


async def child_event(event: Any, resource: Any, memo: Any, **_: Any) -> None:
    controller: Controller = memo.controller
    controller.child_seen(event["type"], resource.kind, event["object"])


async def model_pod_event(event: Any, memo: Any, **_: Any) -> None:
    controller: Controller = memo.controller
    controller.pod_seen(event["type"], event["object"])


def registry(*, peering: bool) -> kopf.OperatorRegistry:
    """A registry of our handlers, registered as the decorators would; with `peering`, the child and pod
    watches too (module doc)."""
    made = kopf.OperatorRegistry()
    kopf.on.login(registry=made)(login)
    kopf.on.startup(registry=made)(startup)
    kopf.on.cleanup(registry=made)(cleanup)
    kopf.on.event(c.GROUP, c.VERSION, c.PLURAL, registry=made)(deployment_event)
    if peering:
        for kind in apply.MANAGED_KINDS:
            kopf.on.event(kind.api_version, kind.plural, labels=_CHILD_LABELS, registry=made)(child_event)
        kopf.on.event("v1", "pods", labels=_MODEL_POD_LABELS, registry=made)(model_pod_event)
    return made
