"""Child events in one controller with an in-memory API server: the echo of our own apply costs nothing, a deleted
or hand-changed child is applied again (paced when it keeps happening), a pruned child stays pruned, and an
apply the server refuses over someone else's list entry is sent again without it."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from epd_operator import _kube, apply
from tests.unit.operator.test_status_runtime import Api, body, child_seen, coalesced, runtime, seen

pytestmark = pytest.mark.unit

CM = "/api/v1/namespaces/ns/configmaps/demo-encoder-bundle"
KEY = ("ConfigMap", "ns", "demo-encoder-bundle")


def live(api: Api, path: str = CM) -> dict[str, Any]:
    """The object as a watch event would carry it."""
    found = copy.deepcopy(api.objects[path])
    found.pop("_content")
    return found


def edit_by_hand(api: Api, path: str = CM) -> dict[str, Any]:
    """Someone changed it: new content, new resourceVersion (the fake keeps no managedFields)."""
    api.rv += 1
    api.objects[path]["data"] = {"bundle.json": "{}"}
    api.objects[path]["metadata"]["resourceVersion"] = str(api.rv)
    api.objects[path]["_content"] = "edited"
    return live(api, path)


def test_the_echo_of_our_own_apply_sends_nothing() -> None:
    api = Api()
    rt, events = runtime(api)

    async def scenario() -> None:
        await seen(rt, body())
        api.requests.clear()
        for path in [p for p in api.objects if "/namespaces/ns/" in p]:
            kind = api.objects[path]["kind"]
            rt.child_seen("MODIFIED", kind, live(api, path))
            rt.child_seen(None, kind, live(api, path))  # a re-listing after a watch reconnects
        assert rt.runtime.world.touched, "the echoes wait for their pass"
        await coalesced(rt)
        assert rt.runtime.world.touched == {}, "the pass took them"

    asyncio.run(scenario())
    assert api.writes() == []
    assert [e for e in events if e[1] in ("Restored", "Reverted")] == []


def test_a_deleted_child_comes_back_once() -> None:
    api = Api()
    rt, events = runtime(api)

    async def scenario() -> None:
        await seen(rt, body())
        gone = live(api)
        del api.objects[CM]
        api.requests.clear()
        await child_seen(rt, "DELETED", "ConfigMap", gone)
        assert CM in api.objects
        await child_seen(rt, "ADDED", "ConfigMap", live(api))  # the echo of the restore

    asyncio.run(scenario())
    assert api.writes() == [("PATCH", CM)]
    assert events.count(("warn", "Restored")) == 1


def test_a_hand_edit_is_reverted_and_a_status_update_is_not_an_edit() -> None:
    api = Api()
    rt, events = runtime(api)
    path = "/apis/apps/v1/namespaces/ns/deployments/demo-encoder"

    async def scenario() -> None:
        await seen(rt, body())
        api.requests.clear()
        await child_seen(rt, "MODIFIED", "ConfigMap", edit_by_hand(api))
        assert api.objects[CM]["data"] != {"bundle.json": "{}"}, "the rendered bundle is back"
        ready = live(api, path)
        ready["status"] = {"readyReplicas": 1}
        ready["metadata"]["resourceVersion"] = "999"  # a status write moves the resourceVersion, not the generation
        await child_seen(rt, "MODIFIED", "Deployment", ready)

    asyncio.run(scenario())
    assert api.writes() == [("PATCH", CM)]
    assert ("warn", "Reverted") in events


def test_a_pruned_child_is_not_restored() -> None:
    api = Api()
    rt, _ = runtime(api)

    async def scenario() -> None:
        await seen(rt, body())
        api.requests.clear()
        stray = live(api)
        stray["metadata"]["name"] = "demo-old-bundle"  # as if an earlier spec had it
        await child_seen(rt, "DELETED", "ConfigMap", stray)

    asyncio.run(scenario())
    assert api.writes() == []


def test_repairs_of_one_child_are_paced() -> None:
    api = Api()
    rt, _ = runtime(api)
    rt.runtime.pacer.burst, rt.runtime.pacer.interval_s = 2, 1.0

    async def scenario() -> list[int]:
        await seen(rt, body())
        api.requests.clear()
        counts = []
        for _ in range(4):  # a writer that keeps undoing ours
            await child_seen(rt, "MODIFIED", "ConfigMap", edit_by_hand(api))
            counts.append(len(api.writes()))
        await asyncio.sleep(1.5)
        counts.append(len(api.writes()))
        return counts

    assert asyncio.run(scenario()) == [1, 2, 2, 2, 3], "two at once, the rest in one paced repair"


def test_a_failed_restore_is_retried() -> None:
    api = Api()
    rt, events = runtime(api)

    async def scenario() -> None:
        await seen(rt, body())
        gone = live(api)
        del api.objects[CM]
        api.fail_applies = True
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("epd_operator.repairs.RETRY_REPAIR_S", 0.1)
            await child_seen(rt, "DELETED", "ConfigMap", gone)
            api.fail_applies = False
            await asyncio.sleep(0.3)

    asyncio.run(scenario())
    assert CM in api.objects
    assert ("warn", "RepairFailed") in events and ("warn", "Restored") in events


class Refusing:
    """An API server that refuses the first apply as a real one does when a foreign port clashes with ours, and
    lists `held` (the object as it holds it)."""

    def __init__(self, held: dict[str, Any]) -> None:
        self.held = held
        self.requests: list[tuple[str, str | None, Any]] = []

    async def request(
        self, method: str, path: str, *, query: Any = None, body: Any = None, content_type: str = ""
    ) -> Any:
        self.requests.append((method, content_type, body))
        if content_type == _kube.APPLY_PATCH and len(self.requests) == 1:
            raise _kube.InvalidError(method, path, 422, "Invalid", 'spec.ports[1].name: Duplicate value: "http"')
        if method == "GET":
            assert query == {"fieldSelector": "metadata.name=s"}
            return {"items": [{k: v for k, v in self.held.items() if k not in ("apiVersion", "kind")}]}
        return {"metadata": {"resourceVersion": "9"}}


def test_a_refused_apply_goes_again_without_the_foreign_entry() -> None:
    desired: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "s", "namespace": "ns"},
        "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
    }
    renumbered = copy.deepcopy(desired)
    renumbered["spec"]["ports"][0]["port"] = 81
    renumbered["metadata"].update(
        resourceVersion="7",
        managedFields=[
            {
                "manager": "kubectl-patch",
                "operation": "Update",
                "fieldsV1": {"f:spec": {"f:ports": {'k:{"port":81,"protocol":"TCP"}': {}}}},
            }
        ],
    )
    watched = {"metadata": renumbered["metadata"]}  # a metadata-only watch's: the whole is read to find the entry
    api = Refusing(renumbered)
    answers = asyncio.run(apply.apply(api, desired, watched))
    assert len(answers) == 2, "the removal's answer too: its late event is the repair's own echo"
    assert [(m, ct) for m, ct, _ in api.requests] == [
        ("PATCH", _kube.APPLY_PATCH),
        ("GET", ""),
        ("PATCH", _kube.JSON_PATCH),
        ("PATCH", _kube.APPLY_PATCH),
    ]
    assert api.requests[2][2] == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        {"op": "remove", "path": "/spec/ports/0"},
    ]
    with pytest.raises(_kube.InvalidError):  # nothing foreign to remove: the refusal stands
        asyncio.run(apply.apply(Refusing(desired), desired, desired))


def test_the_late_event_of_a_repairs_first_write_is_its_own_echo() -> None:
    memory = apply.Applied()
    desired: dict[str, Any] = {"kind": "Service", "metadata": {"name": "s", "namespace": "ns"}}
    removed = {"metadata": {"uid": "u", "resourceVersion": "8"}}
    final = {"metadata": {"uid": "u", "resourceVersion": "9"}}
    digest = apply.fingerprint(desired)
    memory.record(desired, digest, [removed, final])
    assert memory.unchanged(desired, digest, removed) and memory.unchanged(desired, digest, final)
    someone = {"metadata": {"uid": "u", "resourceVersion": "10"}}
    assert not memory.unchanged(desired, digest, someone)
    assert not memory.unchanged(desired, "another render", final)
