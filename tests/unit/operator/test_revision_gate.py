"""The revision-ready gate's decision: a revision takes traffic only as a whole set, and never loses it again."""

from __future__ import annotations

from typing import Any

import pytest

from epd_connectors.config.roles import Role
from epd_operator.api import constants as c
from epd_operator.render import RoleWorkload
from epd_operator.revision_gate import ModelPod, gates_to_open, model_pod, model_roles, open_gate_patch

pytestmark = pytest.mark.unit

ROLES = frozenset({"encoder", "prefill", "decode"})


def pod(name: str, role: str, revision: str, *, up: bool = True, gate: bool = False, going: bool = False) -> ModelPod:
    return ModelPod(name, role, revision, containers_ready=up, gate_open=gate, terminating=going)


def names(pods: list[ModelPod]) -> list[str]:
    return [p.name for p in pods]


OLD = [
    pod("e-a", "encoder", "a", gate=True),
    pod("p-a", "prefill", "a", gate=True),
    pod("d-a", "decode", "a", gate=True),
]


def test_a_new_revision_opens_only_when_every_role_has_a_pod_up_and_then_all_at_once() -> None:
    rolling = [*OLD, pod("e-b", "encoder", "b"), pod("p-b", "prefill", "b"), pod("d-b", "decode", "b", up=False)]
    assert gates_to_open(rolling, ROLES) == []  # the decode of b still loads: the old set serves alone
    rolling[-1] = pod("d-b", "decode", "b")
    assert names(gates_to_open(rolling, ROLES)) == ["d-b", "e-b", "p-b"]


def test_a_pod_going_does_not_count_and_is_not_opened() -> None:
    pods = [pod("e-b", "encoder", "b"), pod("p-b", "prefill", "b"), pod("d-b", "decode", "b", going=True)]
    assert gates_to_open(pods, ROLES) == []


def test_a_replacement_or_scale_out_of_a_serving_revision_opens_before_its_containers_are_up() -> None:
    pods = [*OLD, pod("e-a2", "encoder", "a", up=False)]
    assert names(gates_to_open(pods, ROLES)) == ["e-a2"]


def test_an_open_gate_stays_open_when_its_set_loses_a_pod() -> None:
    pods = [OLD[0], OLD[1], pod("d-a", "decode", "a", up=False, gate=True)]
    assert gates_to_open(pods, ROLES) == []  # nothing to open, and the decision never closes a gate


def test_the_roles_a_set_needs_are_the_model_roles_with_replicas() -> None:
    workloads = [
        RoleWorkload(Role.MASTER, "Deployment", "d-master", 1),
        RoleWorkload(Role.ENCODER, "Deployment", "d-encoder", 0),
        RoleWorkload(Role.PD, "Deployment", "d-pd", 2),
        RoleWorkload(Role.PROXY, "Deployment", "d-proxy", 1),
    ]
    assert model_roles(workloads) == frozenset({"pd"})


def _pod_object(**status: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "demo-decode-1",
            "labels": {c.LABEL_ROLE: "decode", c.LABEL_MODEL_REVISION: "0123456789abcdef"},
        },
        "status": {"conditions": [{"type": kind, "status": value} for kind, value in status.items()]},
    }


def test_a_pod_object_reads_as_its_facts_and_its_patch_opens_its_gate() -> None:
    facts = model_pod(_pod_object(ContainersReady="True", **{c.CONDITION_REVISION_READY: "False"}))
    assert facts == ModelPod("demo-decode-1", "decode", "0123456789abcdef", True, False, False)
    (condition,) = open_gate_patch(facts, "2026-12-03T00:00:00Z")["status"]["conditions"]
    assert condition["type"] == c.CONDITION_REVISION_READY and condition["status"] == "True"
    unlabelled = _pod_object()
    del unlabelled["metadata"]["labels"][c.LABEL_MODEL_REVISION]
    assert model_pod(unlabelled) is None
