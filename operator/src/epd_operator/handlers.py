"""The kopf handlers: each passes what kopf saw to the controller, which keeps it and enqueues the deployment.

They live in their own registry (`registry`), which `main` hands to kopf, so importing this module never
touches kopf's global one. Every handler is an event handler: kopf keeps no state of its own on our objects (no
annotations, no finalizer; owner references let the garbage collector delete the children). Every kind the
operator creates (`apply.MANAGED_KINDS`) is watched, so a child deleted or changed by hand is repaired at once;
those watches are filtered on the server by label (`configure`), so the operator never receives a ConfigMap or
Deployment it does not manage. The model pods (encoder, prefill, decode, PD) are watched the same way, for their
revision gates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from epd_operator import _kube, apply
from epd_operator.api import constants as c
from epd_operator.controller import Controller
from epd_operator.metrics import Metrics
from epd_operator.settings import Settings

registry = kopf.OperatorRegistry()

CHILD_SELECTOR = f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY},{c.LABEL_DEPLOYMENT}"
"""Server-side label selector of the child watches: ours, and belonging to some EPDDeployment."""

_CHILD_LABELS: Mapping[str, Any] = {
    c.LABEL_MANAGED_BY: c.MANAGED_BY,
    c.LABEL_DEPLOYMENT: kopf.PRESENT,
}
MODEL_POD_SELECTOR = f"{CHILD_SELECTOR},{c.LABEL_MODEL_REVISION}"
"""Server-side label selector of the pod watch: the model pods (encoder, prefill, decode, PD) of our deployments."""
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
    """Our kopf settings: no diff base, idle workers gone soon, child watches filtered by label, Events under our
    name."""
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.queueing.idle_timeout = IDLE_WORKER_S
    for kind in apply.MANAGED_KINDS:
        settings.watching.label_selectors[kind.api_version, kind.plural] = CHILD_SELECTOR
    settings.watching.label_selectors["v1", "pods"] = MODEL_POD_SELECTOR
    settings.posting.reporting_component = c.MANAGED_BY


@kopf.on.login(registry=registry)
async def login(memo: Any, **_: Any) -> kopf.ConnectionInfo:
    """kopf connects as our own client does (same server, same identity, read again when it expires)."""
    controller: Controller = memo.controller
    return await controller.runtime.client.credentials()


@kopf.on.startup(registry=registry)
async def startup(memo: Any, **_: Any) -> None:
    """Connect, and share one Controller with every handler (kopf copies the memo's attributes per resource)."""
    settings: Settings = memo.settings
    metrics: Metrics = memo.metrics
    memo.controller = Controller(await _kube.Client.connect(settings.connection), settings, metrics)


@kopf.on.cleanup(registry=registry)
async def cleanup(memo: Any, **_: Any) -> None:
    controller: Controller | None = getattr(memo, "controller", None)
    if controller is not None:
        await controller.close()


@kopf.on.event(c.GROUP, c.VERSION, c.PLURAL, registry=registry)
async def deployment_event(event: Any, memo: Any, **_: Any) -> None:
    """Async, as every handler here: kopf runs a plain function in a thread, away from the controller's loop."""
    controller: Controller = memo.controller
    controller.deployment_seen(event["type"], event["object"])


async def child_event(event: Any, resource: Any, memo: Any, **_: Any) -> None:
    controller: Controller = memo.controller
    controller.child_seen(event["type"], resource.kind, event["object"])


for _kind in apply.MANAGED_KINDS:  # registered like the decorators would, once per kind
    kopf.on.event(_kind.api_version, _kind.plural, labels=_CHILD_LABELS, registry=registry)(child_event)


@kopf.on.event("v1", "pods", labels=_MODEL_POD_LABELS, registry=registry)
async def model_pod_event(event: Any, memo: Any, **_: Any) -> None:
    controller: Controller = memo.controller
    controller.pod_seen(event["type"], event["object"])
