"""managed_fields on objects shaped as the API server returns them (fieldsV1 as a local control plane wrote it
for a Service whose port someone renumbered with `kubectl patch`)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from epd_operator import managed_fields
from epd_operator.api import constants as c

pytestmark = pytest.mark.unit

PORT_80 = 'k:{"port":80,"protocol":"TCP"}'
PORT_81 = 'k:{"port":81,"protocol":"TCP"}'


def entry(manager: str, fields: dict[str, Any], operation: str = "Update", **extra: str) -> dict[str, Any]:
    return {
        "manager": manager,
        "operation": operation,
        "apiVersion": "v1",
        "time": "2026-11-30T09:02:33Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
        **extra,
    }


def ours(fields: dict[str, Any]) -> dict[str, Any]:
    return entry(c.FIELD_MANAGER, fields, operation="Apply")


DESIRED: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "demo-encoder", "namespace": "ns", "labels": {"x": "z"}},
    "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}], "selector": {"a": "b"}},
}
OUR_FIELDS: dict[str, Any] = {
    "f:metadata": {"f:labels": {"f:x": {}}},
    "f:spec": {"f:clusterIP": {}, "f:ports": {PORT_80: {".": {}, "f:name": {}, "f:port": {}}}, "f:selector": {}},
}


def service(port: int = 80, managed: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    live = copy.deepcopy(DESIRED)
    live["metadata"].update(uid="u1", resourceVersion="7", managedFields=managed or [ours(OUR_FIELDS)])
    live["spec"]["ports"][0].update(port=port, targetPort=80)
    return live


def test_held_moves_only_when_a_field_we_own_leaves_our_entry() -> None:
    before = managed_fields.held(service())
    assert managed_fields.held(service()) == before
    busy = service(managed=[ours(OUR_FIELDS), entry("kube-controller-manager", {"f:status": {}}, subresource="status")])
    busy["metadata"]["resourceVersion"] = "9"
    assert managed_fields.held(busy) == before, "status updates and a new resourceVersion are not drift"
    annotated = service(managed=[ours(OUR_FIELDS), entry("kubectl-annotate", {"f:metadata": {"f:annotations": {}}})])
    assert managed_fields.held(annotated) == before, "someone else's own field is not drift"
    taken = copy.deepcopy(OUR_FIELDS)
    del taken["f:spec"]["f:selector"]
    edited = service(managed=[ours(taken), entry("kubectl-edit", {"f:spec": {"f:selector": {}}})])
    assert managed_fields.held(edited) != before, "a field of ours changed hands"
    recreated = service()
    recreated["metadata"]["uid"] = "u2"
    assert managed_fields.held(recreated) != before


def test_held_without_managed_fields_falls_back_to_generation_then_resource_version() -> None:
    plain: dict[str, Any] = {"metadata": {"uid": "u", "resourceVersion": "5"}}
    assert managed_fields.held(plain) == "u:rv5"
    plain["metadata"]["generation"] = 2
    assert managed_fields.held(plain) == "u:g2"


def test_a_renumbered_port_is_a_foreign_entry_and_an_edited_one_is_not() -> None:
    renumbered = service(
        port=81,
        managed=[
            ours({"f:metadata": {"f:labels": {"f:x": {}}}, "f:spec": {"f:clusterIP": {}, "f:selector": {}}}),
            entry("kubectl-patch", {"f:spec": {"f:ports": {PORT_81: {".": {}, "f:port": {}, "f:name": {}}}}}),
        ],
    )
    assert managed_fields.foreign_entries(renumbered, DESIRED) == ["/spec/ports/0"]
    retargeted = service(managed=[ours(OUR_FIELDS), entry("kubectl-edit", {"f:spec": {"f:ports": {PORT_80: {}}}})])
    assert managed_fields.foreign_entries(retargeted, DESIRED) == [], "port 80 is rendered: edited, not foreign"


def test_foreign_entries_nested_in_rendered_entries_last_index_first() -> None:
    desired: dict[str, Any] = {
        "spec": {
            "containers": [{"name": "main", "ports": [{"containerPort": 8000, "protocol": "TCP"}]}],
            "volumes": [{"name": "bundle"}],
        }
    }
    live = copy.deepcopy(desired)
    live["spec"]["containers"][0]["ports"] += [
        {"containerPort": 9000, "protocol": "TCP"},
        {"containerPort": 9001, "protocol": "TCP"},
    ]
    live["spec"]["containers"].append({"name": "sidecar", "ports": [{"containerPort": 7000, "protocol": "TCP"}]})
    live["spec"]["tolerations"] = [{"key": "t"}]
    sidecar = 'k:{"name":"sidecar"}'
    theirs = {
        "f:spec": {
            "f:containers": {
                'k:{"name":"main"}': {
                    "f:ports": {
                        'k:{"containerPort":9000,"protocol":"TCP"}': {},
                        'k:{"containerPort":9001,"protocol":"TCP"}': {},
                    }
                },
                sidecar: {"f:ports": {'k:{"containerPort":7000,"protocol":"TCP"}': {}}},
            },
            "f:tolerations": {'k:{"key":"t"}': {}},  # not a list we render
        }
    }
    live["metadata"] = {"managedFields": [entry("someone", theirs), entry("kubelet", theirs, subresource="status")]}
    assert managed_fields.foreign_entries(live, desired) == [
        "/spec/containers/1",
        "/spec/containers/0/ports/2",
        "/spec/containers/0/ports/1",
    ]


def test_json_pointers_escape_slashes_and_tildes() -> None:
    desired: dict[str, Any] = {"data": {"a/b": [{"k": 1}]}}
    live: dict[str, Any] = {
        "data": {"a/b": [{"k": 1}, {"k": 2}]},
        "metadata": {"managedFields": [entry("x", {"f:data": {"f:a/b": {'k:{"k":2}': {}}}})]},
    }
    assert managed_fields.foreign_entries(live, desired) == ["/data/a~1b/1"]
