"""The revision gate's step in one controller with the in-memory API server: pod events open the gates of a
whole revision with one status patch each, a pod listed before its deployment is reconciled (an operator
restart) is opened by the reconcile, and a refused patch leaves the gate for the pod's next event."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from epd_operator import _kube
from epd_operator.api import constants as c
from epd_operator.controller import Controller
from tests.unit.operator.test_status_runtime import Api, body, coalesced, runtime, seen

pytestmark = pytest.mark.unit

REVISION = "0123456789abcdef"


class GateApi(Api):
    """Records the pods' status patches (the gate openings) besides what the fake server does."""

    def __init__(self) -> None:
        super().__init__()
        self.opened: list[str] = []
        self.refuse_gates = False

    async def request(
        self, method: str, path: str, *, query: Any = None, body: object = None, content_type: str = _kube.JSON
    ) -> dict[str, Any]:
        if "/pods/" in path and path.endswith("/status"):
            assert method == "PATCH" and content_type == _kube.STRATEGIC_MERGE_PATCH and isinstance(body, dict)
            if self.refuse_gates:
                raise _kube.ForbiddenError(method, path, 403, "Forbidden", "no")
            (condition,) = body["status"]["conditions"]
            assert condition["type"] == c.CONDITION_REVISION_READY and condition["status"] == "True"
            self.opened.append(path.split("/")[-2])
            return {}
        return await super().request(method, path, query=query, body=body, content_type=content_type)


def pod(name: str, role: str, *, up: bool, revision: str = REVISION) -> dict[str, Any]:
    labels = {c.LABEL_DEPLOYMENT: "demo", c.LABEL_ROLE: role, c.LABEL_MODEL_REVISION: revision}
    conditions = [{"type": "ContainersReady", "status": "True" if up else "False"}]
    return {"metadata": {"name": name, "namespace": "ns", "labels": labels}, "status": {"conditions": conditions}}


async def pod_seen(ctl: Controller, event_type: str, model_pod: dict[str, Any]) -> None:
    """A model pod's watch event, and the pass it brings (after the coalescing window)."""
    ctl.pod_seen(event_type, model_pod)
    await coalesced(ctl)


def test_a_whole_revision_opens_with_one_patch_per_pod() -> None:
    api = GateApi()
    rt, _ = runtime(api)

    async def scenario() -> None:
        await seen(rt, body())  # encoder, PD and proxy: the model roles are encoder and pd
        await pod_seen(rt, "ADDED", pod("demo-encoder-1", "encoder", up=True))
        assert api.opened == []  # no PD yet
        await pod_seen(rt, "ADDED", pod("demo-pd-1", "pd", up=False))
        assert api.opened == []  # the PD's containers are not up
        await pod_seen(rt, "MODIFIED", pod("demo-pd-1", "pd", up=True))
        assert sorted(api.opened) == ["demo-encoder-1", "demo-pd-1"]
        await pod_seen(rt, "MODIFIED", pod("demo-pd-1", "pd", up=True))
        assert len(api.opened) == 2, "an open gate is not patched again"

    asyncio.run(scenario())


def test_pods_listed_before_the_reconcile_are_opened_by_it() -> None:
    api = GateApi()
    rt, _ = runtime(api)

    async def scenario() -> None:
        await pod_seen(rt, "ADDED", pod("demo-encoder-1", "encoder", up=True))
        await pod_seen(rt, "ADDED", pod("demo-pd-1", "pd", up=True))
        assert api.opened == []  # not reconciled: the roles a set needs are not known yet
        await seen(rt, body())
        assert sorted(api.opened) == ["demo-encoder-1", "demo-pd-1"]

    asyncio.run(scenario())


def test_a_refused_patch_is_tried_again_on_the_pods_next_event() -> None:
    api = GateApi()
    rt, _ = runtime(api)

    async def scenario() -> None:
        await seen(rt, body())
        api.refuse_gates = True
        await pod_seen(rt, "ADDED", pod("demo-encoder-1", "encoder", up=True))
        await pod_seen(rt, "ADDED", pod("demo-pd-1", "pd", up=True))
        assert api.opened == []
        api.refuse_gates = False
        await pod_seen(rt, "MODIFIED", pod("demo-pd-1", "pd", up=True))
        assert sorted(api.opened) == ["demo-encoder-1", "demo-pd-1"]

    asyncio.run(scenario())
