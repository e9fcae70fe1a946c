"""apply against an in-memory API server: server-side apply requests, skipping what is unchanged, pruning only
our own children, the apply order, and error mapping."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Mapping
from typing import Any

import pytest

from epd_operator import _kube, apply
from epd_operator.api import constants as c
from epd_operator.api.resource import Owner

pytestmark = pytest.mark.unit

OWNER = Owner("demo", "ns", "uid-1", 1)
OTHER = Owner("demo", "ns", "uid-old", 1)


CHILD_PLURALS = {k.plural for k in apply.MANAGED_KINDS}
"""The chart grants list and watch on these, never get (tests/cluster/test_chart_operator.py)."""


class FakeApi:
    """Just enough of the API server: SSA replaces the object (new resourceVersion only when content changes),
    list by label selector, delete with a uid precondition. Every request is recorded."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.rv = 100

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str = _kube.JSON,
    ) -> dict[str, Any]:
        self.requests.append((method, path))
        if method == "PATCH":
            assert content_type == _kube.APPLY_PATCH
            assert query == {"fieldManager": c.FIELD_MANAGER, "force": "true"}
            assert isinstance(body, dict)
            return self._apply(path, body)
        if method == "GET" and query is None:  # one object
            assert path.rsplit("/", 2)[1] not in CHILD_PLURALS, f"GET {path}: the chart grants no get on children"
            if path not in self.objects:
                raise _kube.NotFoundError(method, path, 404, "NotFound", "not found")
            return _public(self.objects[path])
        if method == "GET":
            assert query is not None
            labels = query.get("labelSelector")
            wanted = dict(pair.split("=") for pair in labels.split(",")) if labels else {}
            name = query.get("fieldSelector", "").removeprefix("metadata.name=")
            items = [
                _public(o)
                for p, o in self.objects.items()
                if p.rsplit("/", 1)[0] == path
                and wanted.items() <= o["metadata"].get("labels", {}).items()
                and name in ("", o["metadata"]["name"])
            ]
            for item in items:  # a real list omits these
                item.pop("kind"), item.pop("apiVersion")
            return {"items": items}
        if method == "DELETE":
            assert isinstance(body, dict)
            live = self.objects.get(path)
            if live is None:
                raise _kube.NotFoundError(method, path, 404, "NotFound", "")
            if body.get("preconditions", {}).get("uid") not in (None, live["metadata"]["uid"]):
                raise _kube.ConflictError(method, path, 409, "Conflict", "uid precondition")
            del self.objects[path]
            return {}
        raise AssertionError(method)

    def _apply(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        before = self.objects.get(path)
        content = json.dumps(body, sort_keys=True)
        if before is not None and before["_content"] == content:
            return _public(before)
        self.rv += 1
        meta = {**body["metadata"], "resourceVersion": str(self.rv), "uid": f"uid-{path}"}
        if body["kind"] in apply.WORKLOAD_KINDS:
            meta["generation"] = (before["metadata"]["generation"] + 1) if before else 1
        self.objects[path] = {**body, "metadata": meta, "_content": content}
        return _public(self.objects[path])

    def writes(self) -> list[tuple[str, str]]:
        return [r for r in self.requests if r[0] != "GET"]


def _public(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in copy.deepcopy(obj).items() if k != "_content"}


def obj(kind: str, name: str, owner: Owner = OWNER, **extra: Any) -> dict[str, Any]:
    api_version = apply._BY_KIND[kind].api_version
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": owner.namespace,
            "labels": {c.LABEL_DEPLOYMENT: owner.name, c.LABEL_MANAGED_BY: c.MANAGED_BY},
            "ownerReferences": [owner.owner_reference()],
        },
        **extra,
    }


def desired(encoders: int = 1, prefill: bool = True) -> list[dict[str, Any]]:
    objs = [obj("ConfigMap", "demo-encoder-bundle", data={"bundle.json": "{}"})]
    objs += [obj("ConfigMap", "demo-prefill-bundle", data={"bundle.json": "{}"})] if prefill else []
    objs += [obj("Service", "demo-encoder", spec={"clusterIP": "None"})]
    objs += [obj("Deployment", "demo-encoder", spec={"replicas": encoders})]
    objs += [obj("Deployment", "demo-prefill", spec={"replicas": 1})] if prefill else []
    objs += [obj("Deployment", "demo-proxy", spec={"replicas": 1})]
    return objs


def sync(api: FakeApi, objects: list[dict[str, Any]], memory: apply.Applied, owner: Owner = OWNER) -> apply.SyncResult:
    return asyncio.run(apply.sync(api, owner, objects, memory))


def test_first_sync_applies_everything_with_our_field_manager() -> None:
    api, memory = FakeApi(), apply.Applied()
    result = sync(api, desired(), memory)
    assert len(result.written) == 6 and result.sent == 6 and result.skipped == 0 and result.deleted == []
    assert {r[0] for r in api.writes()} == {"PATCH"}
    assert ("PATCH", "/apis/apps/v1/namespaces/ns/deployments/demo-encoder") in api.requests
    assert [o["metadata"]["name"] for o in result.live] == [o["metadata"]["name"] for o in desired()]


def test_second_sync_sends_nothing() -> None:
    api, memory = FakeApi(), apply.Applied()
    sync(api, desired(), memory)
    api.requests.clear()
    result = sync(api, desired(), memory)
    assert api.writes() == []
    assert (result.sent, result.skipped, result.changed) == (0, 6, False)


def test_a_fresh_process_reapplies_once_and_the_server_writes_nothing() -> None:
    api = FakeApi()
    sync(api, desired(), apply.Applied())
    before = {p: o["metadata"]["resourceVersion"] for p, o in api.objects.items()}
    result = sync(api, desired(), apply.Applied())
    assert result.sent == 6 and result.written == [] and not result.changed
    assert {p: o["metadata"]["resourceVersion"] for p, o in api.objects.items()} == before


def test_scaling_sends_only_the_changed_workload() -> None:
    api, memory = FakeApi(), apply.Applied()
    sync(api, desired(encoders=1), memory)
    api.requests.clear()
    result = sync(api, desired(encoders=3), memory)
    assert api.writes() == [("PATCH", "/apis/apps/v1/namespaces/ns/deployments/demo-encoder")]
    assert result.written == [("Deployment", "ns", "demo-encoder")]


def test_drift_on_the_server_is_repaired() -> None:
    api, memory = FakeApi(), apply.Applied()
    sync(api, desired(), memory)
    path = "/apis/apps/v1/namespaces/ns/deployments/demo-encoder"
    api.objects[path]["metadata"]["generation"] += 1  # someone scaled it by hand (a write: a new version)
    api.objects[path]["metadata"]["resourceVersion"] = "999"
    api.requests.clear()
    sync(api, desired(), memory)
    assert api.writes() == [("PATCH", path)]


def test_removed_objects_are_pruned() -> None:
    api, memory = FakeApi(), apply.Applied()
    sync(api, desired(prefill=True), memory)
    api.requests.clear()
    result = sync(api, desired(prefill=False), memory)
    assert sorted(result.deleted) == [("ConfigMap", "ns", "demo-prefill-bundle"), ("Deployment", "ns", "demo-prefill")]
    assert sorted(p for m, p in api.writes()) == [
        "/api/v1/namespaces/ns/configmaps/demo-prefill-bundle",
        "/apis/apps/v1/namespaces/ns/deployments/demo-prefill",
    ]
    assert not any(p.endswith("demo-prefill") for p in api.objects)


def test_objects_of_another_owner_are_never_pruned() -> None:
    api = FakeApi()
    sync(api, [obj("ConfigMap", "stray", owner=OTHER)], apply.Applied(), owner=OTHER)
    result = sync(api, desired(), apply.Applied())
    assert result.deleted == []
    assert "/api/v1/namespaces/ns/configmaps/stray" in api.objects


def held_by(holder: Owner, kind: str, name: str) -> dict[str, Any]:
    return {**obj(kind, name, owner=holder), "metadata": {**obj(kind, name, owner=holder)["metadata"], "uid": "x"}}


def test_conflicts_are_objects_another_epddeployment_controls() -> None:
    other = Owner("demo-prefill", "ns", "uid-9", 1)
    foreign = {**held_by(OWNER, "Service", "demo-encoder")}
    foreign["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "uid": "r", "controller": True}
    ]
    unowned = obj("ConfigMap", "demo-proxy-bundle")
    unowned["metadata"]["ownerReferences"] = []
    found = apply.conflicts(
        OWNER,
        [
            held_by(other, "Service", "demo-prefill-decode"),  # another deployment's: the conflict
            held_by(OWNER, "ConfigMap", "demo-encoder-bundle"),  # ours
            held_by(OTHER, "Deployment", "demo-encoder"),  # an earlier "demo" (deleted): adopted
            foreign,  # not an EPDDeployment's
            unowned,
        ],
    )
    assert found == [apply.NameConflict("Service", "demo-prefill-decode", "demo-prefill")]


def test_sync_writes_nothing_when_another_deployment_holds_a_name() -> None:
    api = FakeApi()
    other = Owner("other", "ns", "uid-9", 1)
    sync(
        api, [obj("Service", "demo-encoder", owner=other, spec={"selector": {"app": "other"}})], apply.Applied(), other
    )
    api.requests.clear()
    with pytest.raises(apply.NameConflictError) as raised:
        sync(api, desired(), apply.Applied())
    assert api.writes() == []
    assert raised.value.keys == {("Service", "ns", "demo-encoder")}
    assert "Service demo-encoder belongs to EPDDeployment other" in str(raised.value)
    assert "Fix: give this EPDDeployment" in str(raised.value)
    assert api.objects["/api/v1/namespaces/ns/services/demo-encoder"]["spec"] == {"selector": {"app": "other"}}


class RacingApi(FakeApi):
    """A controller writes a Deployment's status between our listing and our (no-op) apply."""

    async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        if method == "PATCH" and "/deployments/" in path and path in self.objects:
            self.rv += 1
            live = self.objects[path]
            live["metadata"]["resourceVersion"] = str(self.rv)
            live["status"] = {"observedGeneration": live["metadata"]["generation"], "readyReplicas": self.rv}
        return await super().request(method, path, **kwargs)


def test_a_status_write_racing_a_no_op_apply_is_no_write() -> None:
    api = RacingApi()
    sync(api, desired(), apply.Applied())
    result = sync(api, desired(), apply.Applied())  # a fresh process: sends everything once
    assert result.sent == 6
    assert result.written == [] and not result.changed


def test_workloads_start_together_after_the_objects_they_use_and_before_their_autoscalers() -> None:
    meta = {"name": "e", "namespace": "ns"}
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": meta}
    batches = apply._batches([*desired(), hpa])
    assert [[o["kind"] for o in b] for b in batches] == [
        ["ConfigMap", "ConfigMap", "Service"],
        ["Deployment", "Deployment", "Deployment"],
        ["HorizontalPodAutoscaler"],
    ]
    api = FakeApi()
    sync(api, desired(), apply.Applied())
    names = [p.rsplit("/", 1)[1] for m, p in api.requests if m == "PATCH" and "/deployments/" in p]
    assert names == ["demo-encoder", "demo-prefill", "demo-proxy"]


def test_a_role_binding_is_sent_after_its_role() -> None:
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "p", "namespace": "ns"}}
    binding = {**role, "kind": "RoleBinding"}
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "p", "namespace": "ns"}}
    batches = apply._batches([account, role, binding, obj("ConfigMap", "c")])
    assert [[o["kind"] for o in b] for b in batches] == [["ServiceAccount", "Role"], ["RoleBinding", "ConfigMap"]]


def test_an_unmanaged_kind_is_refused_before_any_write() -> None:
    api = FakeApi()
    odd = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x", "namespace": "ns"}}
    with pytest.raises(apply.UnmanagedKindError, match="MANAGED_KINDS"):
        sync(api, [*desired(), odd], apply.Applied())
    assert api.requests == []


class WithoutKeda(FakeApi):
    """An API server that serves no ScaledObject kind: every request to its collection is answered 404."""

    async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        if "/keda.sh/" in path:
            self.requests.append((method, path))
            raise _kube.NotFoundError(method, path, 404, "NotFound", "the server could not find the requested resource")
        return await super().request(method, path, **kwargs)


def test_a_kind_whose_crd_is_missing_is_named_with_the_fix_after_everything_else() -> None:
    api = WithoutKeda()
    scaled = obj("ScaledObject", "demo-encoder", spec={"scaleTargetRef": {"name": "demo-encoder"}})
    with pytest.raises(apply.MissingKindError) as caught:
        sync(api, [*desired(), scaled], apply.Applied())
    assert caught.value.retryable  # installing KEDA later is picked up
    assert "serves no keda.sh/v1alpha1 ScaledObject" in str(caught.value)
    assert "install KEDA, or set the role's autoscaling.engine to hpa" in str(caught.value)
    # The listing of the missing kind counted as empty, and every other child was applied before it.
    assert len([w for w in api.writes() if w[0] == "PATCH"]) == len(desired()) + 1
    assert sync(api, desired(), apply.Applied()).deleted == []


def test_selector_names_the_deployment_and_the_manager() -> None:
    assert apply.selector("demo") == "epd.serving.io/deployment=demo,app.kubernetes.io/managed-by=epd-operator"


@pytest.mark.parametrize(
    ("status", "error", "retryable"),
    [
        (404, _kube.NotFoundError, False),
        (409, _kube.ConflictError, True),
        (422, _kube.InvalidError, False),
        (400, _kube.InvalidError, False),
        (403, _kube.ForbiddenError, True),
        (429, _kube.UnavailableError, True),
        (503, _kube.UnavailableError, True),
        (0, _kube.UnavailableError, True),
        (418, _kube.KubeError, False),
    ],
)
def test_http_statuses_become_our_errors(status: int, error: type[_kube.KubeError], retryable: bool) -> None:
    found = _kube._error_type(status, {})
    assert found is error
    assert found("GET", "/x", status, "Reason", "msg").retryable is retryable


def test_a_terminating_namespace_is_its_own_error_and_not_retried() -> None:
    # The answer the NamespaceLifecycle admission gives an apply that would create in a terminating namespace.
    answer = {
        "reason": "Forbidden",
        "details": {"causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace"}]},
    }
    found = _kube._error_type(403, answer)
    assert found is _kube.NamespaceTerminatingError
    assert found("PATCH", "/x", 403, "Forbidden", "being terminated").retryable is False


def test_collection_paths() -> None:
    assert _kube.collection_path("v1", "configmaps", "ns") == "/api/v1/namespaces/ns/configmaps"
    assert _kube.collection_path("policy/v1", "poddisruptionbudgets", "ns") == (
        "/apis/policy/v1/namespaces/ns/poddisruptionbudgets"
    )
    assert _kube.collection_path("epd.serving.io/v1alpha1", "epddeployments", None) == (
        "/apis/epd.serving.io/v1alpha1/epddeployments"
    )
