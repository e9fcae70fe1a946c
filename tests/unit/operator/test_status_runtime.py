"""How status follows the children, end to end in one controller with an in-memory API server: one status write
per real change, workload states ordered by generation, bursts of events coalesced, invalid specs reported
without touching a child, and API failures retried by the work queue."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from epd_operator import _kube, controller, publish, reconcile, repairs, status
from epd_operator.api import constants as c
from epd_operator.metrics import Metrics
from epd_operator.settings import Settings
from tests.unit.operator.test_apply import FakeApi

pytestmark = pytest.mark.unit

SPEC: dict[str, Any] = {"model": {"name": "m", "source": {"hostPath": {"path": "/m"}}}}
"""Encoder, combined PD and proxy: three Deployments, no store."""
EPD_PATH = f"/apis/{c.API_VERSION}/namespaces/ns/{c.PLURAL}/demo"


class Api(FakeApi):
    """The fake API server, plus the EPDDeployment itself and its status subresource."""

    def __init__(self) -> None:
        super().__init__()
        self.status_writes: list[dict[str, Any]] = []
        self.epd_exists = True
        self.fail_applies = False
        self.refuse: _kube.KubeError | None = None
        """Raised for every apply, when set."""

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Any = None,
        body: object = None,
        content_type: str = _kube.JSON,
    ) -> dict[str, Any]:
        if path == EPD_PATH + "/status":
            assert content_type == _kube.JSON_PATCH and isinstance(body, list)
            self.requests.append((method, path))
            self.status_writes.append(body[0]["value"])
            return {}
        if path == EPD_PATH:
            if not self.epd_exists:
                raise _kube.NotFoundError(method, path, 404, "NotFound", "")
            return {"metadata": {"uid": "uid-1"}}
        if method == "PATCH" and self.refuse is not None:
            raise self.refuse
        if method == "PATCH" and self.fail_applies:
            raise _kube.UnavailableError(method, path, 503, "ServiceUnavailable", "busy")
        return await super().request(method, path, query=query, body=body, content_type=content_type)


def body(spec: dict[str, Any] | None = None, generation: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": "demo", "namespace": "ns", "uid": "uid-1", "generation": generation},
        "spec": spec or SPEC,
    }


QUIET = Settings(all_namespaces=True, store_poll_interval_s=0, transfer_poll_interval_s=0)
"""Nothing read from the deployments' servers unless a test turns it on."""


KEY = ("ns", "demo")


def runtime(api: Api, settings: Settings = QUIET) -> tuple[controller.Controller, list[tuple[str, str]]]:
    ctl = controller.Controller(cast(_kube.Client, api), settings, Metrics(CollectorRegistry()))
    events: list[tuple[str, str]] = []
    ctl.runtime.post_event = lambda level, ref, reason, message: events.append((level, reason))
    return ctl, events


async def seen(ctl: controller.Controller, deployment: dict[str, Any]) -> None:
    """The EPDDeployment's watch event, and the passes it brings."""
    ctl.deployment_seen("MODIFIED", deployment)
    await ctl.queue.idle()


async def until(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    """Until `condition` holds: a loaded machine runs a pass late, never early, so a test waits for what must come
    and bounds only what must not come too soon."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.01)


async def coalesced(ctl: controller.Controller) -> None:
    """Until the pass that the events just sent bring, after the coalescing window, has run."""
    await asyncio.sleep(controller.STATUS_DELAY_S)
    await ctl.queue.idle()


async def child_seen(ctl: controller.Controller, event_type: str | None, kind: str, obj: dict[str, Any]) -> None:
    """A child's watch event, and the pass it brings (a deletion's at once, any other after the coalescing
    window)."""
    ctl.child_seen(event_type, kind, obj)
    if event_type == "DELETED":
        await ctl.queue.idle()
    else:
        await coalesced(ctl)


def workload(api: Api, name: str, ready: int | None = None, generation: int | None = None) -> dict[str, Any]:
    """A Deployment as the watch would report it (from what the fake server holds)."""
    live = copy.deepcopy(api.objects[f"/apis/apps/v1/namespaces/ns/deployments/{name}"])
    live.pop("_content")
    if generation is not None:
        live["metadata"]["generation"] = generation
    gen = live["metadata"]["generation"]
    if ready is not None:
        replicas = live["spec"]["replicas"]
        live["status"] = {"observedGeneration": gen, "replicas": replicas, "updatedReplicas": replicas}
        live["status"]["readyReplicas"] = ready
    return live


def test_reconcile_applies_and_writes_status_once_then_nothing() -> None:
    api = Api()
    rt, events = runtime(api)

    async def scenario() -> None:
        await seen(rt, body())
        assert len(api.status_writes) == 1
        first = api.status_writes[0]
        assert first["phase"] == "Pending" and first["observedGeneration"] == 1
        assert first["rolesReady"] == {"encoder": "0/1", "pd": "0/1", "proxy": "0/1"}
        api.requests.clear()
        await seen(rt, body())  # the echo of our status write: same generation
        assert api.requests == []  # not even a read: the spec was applied, the status is unchanged

    asyncio.run(scenario())
    assert events == [("info", "Applied"), ("info", c.COND_VALID)]
    assert rt.runtime.metrics.registry.get_sample_value("epd_operator_reconciles_total", {"outcome": "changed"}) == 1


def test_workload_events_drive_status_to_ready_in_one_coalesced_write(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controller, "STATUS_DELAY_S", 0.5)  # room for a loaded machine before the window ends
    api = Api()
    rt, events = runtime(api)

    async def scenario() -> None:
        await seen(rt, body())
        for name in ("demo-encoder", "demo-pd", "demo-proxy"):
            rt.child_seen("MODIFIED", "Deployment", workload(api, name, ready=1))
            await rt.queue.idle()
        assert len(api.status_writes) == 1  # the burst waits for the coalescing window
        await until(lambda: len(api.status_writes) == 2, "the burst's one pass")
        await coalesced(rt)
        assert len(api.status_writes) == 2
        ready = status.parse(api.status_writes[-1])
        assert ready.phase == "Ready" and ready.roles_ready["pd"] == "1/1"

    asyncio.run(scenario())
    assert ("info", c.COND_READY) in events


def test_progress_is_written_once_per_interval_and_ready_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publish, "PROGRESS_INTERVAL_S", 2.0)  # long beside the coalescing window, for a loaded machine
    api = Api()
    rt, events = runtime(api)

    async def scenario() -> None:
        await seen(rt, body())  # the first status: at once
        rt.child_seen("MODIFIED", "Deployment", workload(api, "demo-encoder", ready=1))
        await coalesced(rt)
        assert len(api.status_writes) == 1, "progress waits for its turn"
        assert rt.queue.due(KEY) is not None, "and comes back for it"
        await until(lambda: len(api.status_writes) == 2, "the progress, one interval on")
        assert status.parse(api.status_writes[-1]).roles_ready["encoder"] == "1/1"
        for name in ("demo-pd", "demo-proxy"):
            rt.child_seen("MODIFIED", "Deployment", workload(api, name, ready=1))
        await until(lambda: len(api.status_writes) == 3, "Ready within the interval: at once", timeout=1.5)
        assert status.parse(api.status_writes[-1]).phase == "Ready"

    asyncio.run(asyncio.wait_for(scenario(), 10))
    assert ("info", c.COND_READY) in events


def test_an_older_state_never_replaces_a_newer_one() -> None:
    api = Api()
    rt, _ = runtime(api)
    asyncio.run(seen(rt, body()))
    key = ("Deployment", "ns", "demo-encoder")
    watched = workload(api, "demo-encoder", ready=1, generation=2)
    rt.runtime.world.remember(key, watched, watched=True)
    rt.runtime.world.remember(key, workload(api, "demo-encoder", generation=2), watched=False)  # a late apply answer
    assert rt.runtime.world.workloads[key]["status"]["readyReplicas"] == 1
    rt.runtime.world.remember(
        key, workload(api, "demo-encoder", ready=0, generation=1), watched=True
    )  # a lagging watch
    assert rt.runtime.world.workloads[key]["metadata"]["generation"] == 2
    rt.runtime.world.remember(key, workload(api, "demo-encoder", generation=3), watched=False)  # our apply bumped it
    assert rt.runtime.world.workloads[key]["metadata"]["generation"] == 3
    recreated = workload(api, "demo-encoder", ready=0, generation=1)
    recreated["metadata"]["uid"] = "another"
    rt.runtime.world.remember(key, recreated, watched=True)
    assert rt.runtime.world.workloads[key]["metadata"]["uid"] == "another"


def test_invalid_spec_reports_and_touches_no_child() -> None:
    api = Api()
    rt, events = runtime(api)
    bad = {**SPEC, "encoder": {"crossEncoderCache": {"enabled": True}}}  # reuse without a store

    async def scenario() -> None:
        await seen(rt, body(bad))
        await seen(rt, body(bad))

    asyncio.run(scenario())
    assert api.writes() == [("PATCH", EPD_PATH + "/status")]
    st = status.parse(api.status_writes[0])
    assert st.phase == "Invalid"
    assert "spec.encoder.crossEncoderCache.enabled" in next(x.message for x in st.conditions if x.type == "Valid")
    assert events == [("warn", "InvalidSpec")], "one warning, not one per retry"


def test_deleted_workload_of_a_gone_owner_is_not_recreated() -> None:
    api = Api()
    rt, _ = runtime(api)

    async def scenario() -> None:
        await seen(rt, body())
        gone = workload(api, "demo-encoder")
        api.epd_exists = False
        api.requests.clear()
        await child_seen(rt, "DELETED", "Deployment", gone)

    asyncio.run(scenario())
    assert api.writes() == []
    assert rt.states == {}


def test_deleted_workload_of_a_live_owner_is_recreated() -> None:
    api = Api()
    rt, events = runtime(api)

    async def scenario() -> None:
        await seen(rt, body())
        path = "/apis/apps/v1/namespaces/ns/deployments/demo-encoder"
        gone = workload(api, "demo-encoder")
        del api.objects[path]
        await child_seen(rt, "DELETED", "Deployment", gone)
        assert path in api.objects

    asyncio.run(scenario())
    assert ("warn", "Restored") in events


def test_api_failures_are_retried_by_the_queue() -> None:
    api = Api()
    api.fail_applies = True
    rt, events = runtime(api)

    async def scenario() -> list[float | None]:
        dues = []
        for _ in range(3):  # the first pass, then two retries (brought forward here)
            await seen(rt, body())
            dues.append(rt.queue.due(KEY))
        return dues

    dues = asyncio.run(scenario())
    assert all(due is not None for due in dues)
    first, second, third = (cast(float, due) for due in dues)
    assert 0 < first <= reconcile.RETRY_DELAY_S < second <= 2 * reconcile.RETRY_DELAY_S < third, "backing off"
    assert [e for e in events if e[0] == "warn"] == [("warn", "ApplyFailed")]
    assert rt.runtime.metrics.registry.get_sample_value(
        "epd_operator_reconcile_errors_total", {"reason": "UnavailableError"}
    )


def test_a_failed_apply_keeps_reporting_the_previous_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publish, "PROGRESS_INTERVAL_S", 0.0)  # the count below is progress: written at once
    api = Api()
    rt, _ = runtime(api)

    async def scenario() -> None:
        await seen(rt, body())
        api.fail_applies = True
        await seen(rt, body({**SPEC, "decode": {"replicas": 2}}, generation=2))
        assert rt.queue.due(KEY) is not None, "retried"
        await child_seen(rt, "MODIFIED", "Deployment", workload(api, "demo-pd", ready=1))
        await asyncio.sleep(controller.STATUS_DELAY_S + 0.2)

    asyncio.run(scenario())
    latest = status.parse(api.status_writes[-1])
    assert latest.observed_generation == 1
    assert latest.roles_ready["pd"] == "1/1"


def ready_condition(api: Api) -> Any:
    return next(x for x in status.parse(api.status_writes[-1]).conditions if x.type == c.COND_READY)


@pytest.mark.parametrize(
    ("refusal", "retried"),
    [
        (_kube.InvalidError("PATCH", "/x", 422, "Invalid", 'spec.replicas: Invalid value: "x"'), False),
        (
            _kube.UnavailableError("PATCH", "/x", 500, "InternalError", "quantities must match the regular expression"),
            True,
        ),
    ],
)
def test_a_refused_apply_is_reported_in_ready_for_its_generation(refusal: _kube.KubeError, retried: bool) -> None:
    api = Api()
    api.refuse = refusal
    rt, events = runtime(api)

    async def scenario() -> float | None:
        for _ in range(2):  # a second pass, as the retry or another event brings: announced once
            await seen(rt, body(generation=3))
        return rt.queue.due(KEY)

    due = asyncio.run(scenario())
    assert (due is not None) == retried
    st = status.parse(api.status_writes[-1])
    ready = ready_condition(api)
    assert (ready.status, ready.reason) == ("False", "ApplyFailed")
    assert refusal.message in ready.message
    assert st.observed_generation == 3 and ready.observed_generation == 3
    assert len(api.status_writes) == 1
    assert [e for e in events if e[0] == "warn"] == [("warn", "ApplyFailed")]


def their_encoder(label: str) -> dict[str, Any]:
    """A Deployment named as demo's encoder, controlled by EPDDeployment "other" (labelled `label`)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "demo-encoder",
            "namespace": "ns",
            "uid": "theirs",
            "labels": {c.LABEL_DEPLOYMENT: label, c.LABEL_MANAGED_BY: c.MANAGED_BY},
            "ownerReferences": [
                {"apiVersion": c.API_VERSION, "kind": c.KIND, "name": "other", "uid": "u-9", "controller": True}
            ],
        },
        "spec": {"replicas": 5},
    }


def test_a_name_conflict_is_reported_and_tried_again_once_the_object_is_gone() -> None:
    api = Api()
    rt, events = runtime(api)
    path = "/apis/apps/v1/namespaces/ns/deployments/demo-encoder"
    theirs = their_encoder(label="demo-x")
    api.objects[path] = {**theirs, "_content": ""}

    async def scenario() -> None:
        await seen(rt, body())
        assert api.objects[path]["spec"] == {"replicas": 5}, "theirs, untouched"
        assert [m for m, p in api.writes()] == ["PATCH"] and api.writes()[0][1].endswith("/status")
        ready = ready_condition(api)
        assert (ready.status, ready.reason) == ("False", "NameConflict")
        assert "Deployment demo-encoder belongs to EPDDeployment other" in ready.message
        assert [e for e in events if e[0] == "warn"] == [("warn", "NameConflict")]
        del api.objects[path]
        await child_seen(rt, "DELETED", "Deployment", theirs)
        await asyncio.sleep(0.1)

    asyncio.run(scenario())
    assert api.objects[path]["metadata"]["labels"][c.LABEL_DEPLOYMENT] == "demo", "applied once the way was clear"
    assert ready_condition(api).reason != "NameConflict"


def _listings(api: Api) -> list[str]:
    return [path for method, path in api.requests if method == "GET" and path != EPD_PATH]


def test_a_deployment_created_while_the_watches_run_is_applied_without_listing_its_children() -> None:
    api = Api()
    rt, _ = runtime(api)

    async def scenario() -> None:
        rt.runtime.world.listed.add("ns")  # the child watches have listed its namespace
        rt.deployment_seen("ADDED", body())
        await rt.queue.idle()

    asyncio.run(scenario())
    assert _listings(api) == [], "the watches have shown no child of it and no object of its children's names"
    assert api.objects["/apis/apps/v1/namespaces/ns/deployments/demo-encoder"]["metadata"]["labels"]
    assert ready_condition(api).reason != "NameConflict"


def test_a_listed_deployment_and_one_whose_child_names_are_taken_list_before_applying() -> None:
    listed, unwatched, taken = Api(), Api(), Api()
    from_listing, _ = runtime(listed)
    early, _ = runtime(unwatched)
    created, events = runtime(taken)
    path = "/apis/apps/v1/namespaces/ns/deployments/demo-encoder"
    theirs = their_encoder(label="other")
    taken.objects[path] = {**theirs, "_content": ""}

    async def scenario() -> None:
        for rt in (from_listing, created):
            rt.runtime.world.listed.add("ns")
        from_listing.deployment_seen(None, body())  # a watch's first listing: it may predate the child watches
        await from_listing.queue.idle()
        early.deployment_seen("ADDED", body())  # the child watches have not listed its namespace yet
        await early.queue.idle()
        await child_seen(created, None, "Deployment", theirs)
        created.deployment_seen("ADDED", body())
        await created.queue.idle()

    asyncio.run(scenario())
    assert _listings(listed), "a deployment from the first listing is listed"
    assert _listings(unwatched), "a deployment in a namespace the child watches have not listed yet is listed"
    assert _listings(taken), "a name the watches saw taken is checked"
    assert taken.objects[path]["spec"] == {"replicas": 5}, "theirs, untouched"
    assert ready_condition(taken).reason == "NameConflict"
    assert ("warn", "NameConflict") in events


def test_a_restarted_operator_counts_every_stored_phase() -> None:
    rt, _ = runtime(Api())
    stored = {
        "phase": "Ready",
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "AllRolesReady", "lastTransitionTime": "2026-01-01T00:00:00Z"}
        ],
    }
    for i in range(3):
        reconcile.first_seen(
            rt.runtime, {"metadata": {"name": f"d{i}", "namespace": "ns", "uid": f"u{i}"}, "status": stored}
        )
    reconcile.first_seen(rt.runtime, {"metadata": {"name": "new", "namespace": "ns", "uid": "un"}})  # not counted yet
    value = rt.runtime.metrics.registry.get_sample_value
    assert value("epd_operator_deployments", {"phase": "Ready"}) == 3
    assert value("epd_operator_deployments", {"phase": "Pending"}) == 0


def test_a_terminating_namespace_gets_no_repair_and_no_event() -> None:
    api = Api()
    rt, events = runtime(api)

    async def scenario() -> None:
        await seen(rt, body())
        events.clear()
        api.refuse = _kube.NamespaceTerminatingError("PATCH", "/x", 403, "Forbidden", "being terminated")
        for name in ("demo-encoder", "demo-pd", "demo-proxy"):
            gone = workload(api, name)
            del api.objects[f"/apis/apps/v1/namespaces/ns/deployments/{name}"]
            await child_seen(rt, "DELETED", "Deployment", gone)
        await asyncio.sleep(repairs.RETRY_REPAIR_S / 10)

    asyncio.run(scenario())
    assert events == []
    assert rt.states == {} and rt.queue.due(KEY) is None


class RacingApi(Api):
    """A controller writes each Deployment's status just before our apply reaches it."""

    async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        if method == "PATCH" and "/deployments/" in path and path in self.objects:
            self.rv += 1
            self.objects[path]["metadata"]["resourceVersion"] = str(self.rv)
            self.objects[path]["status"] = {"observedGeneration": 1, "replicas": self.rv}
        return await super().request(method, path, **kwargs)


def test_a_no_op_reconcile_after_a_status_write_posts_no_applied_event() -> None:
    api = RacingApi()
    first, _ = runtime(api)
    asyncio.run(seen(first, body()))
    restarted, events = runtime(api)  # a fresh process sends every child once
    asyncio.run(seen(restarted, body()))
    assert ("info", "Applied") not in events
    value = restarted.runtime.metrics.registry.get_sample_value
    assert value("epd_operator_reconciles_total", {"outcome": "unchanged"}) == 1


def test_a_deployment_being_deleted_gets_no_apply_and_no_repair() -> None:
    api = Api()
    rt, _ = runtime(api)
    going = body()
    going["metadata"]["deletionTimestamp"] = "2026-12-06T00:00:00Z"

    async def scenario() -> None:
        await seen(rt, body())
        api.requests.clear()
        await seen(rt, going)  # a foreground deletion: the object stays until its children are gone
        gone = workload(api, "demo-encoder")
        del api.objects["/apis/apps/v1/namespaces/ns/deployments/demo-encoder"]
        await child_seen(rt, "DELETED", "Deployment", gone)
        await seen(rt, going)

    asyncio.run(scenario())
    assert api.requests == []
    assert rt.states == {}
