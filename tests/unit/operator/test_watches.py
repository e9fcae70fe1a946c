"""The operator's own watches, their pure parts: kopf's namespace patterns (checked against kopf's own matcher), a
fresh listing against what a stream knew (a deletion missed while it was down is still delivered), and what the
controller follows (every managed kind, the kinds status never reads as metadata only, the model pods)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from kopf._cogs.structs import references  # kopf's matcher: ours must agree with the EPDDeployments' watch

from epd_operator import _kube, apply, watches
from epd_operator.api import constants as c
from epd_operator.controller import CHILD_SELECTOR, MODEL_POD_SELECTOR, Controller
from epd_operator.world import KEPT_KINDS

pytestmark = pytest.mark.unit

PATTERNS = ["epd-*", "a", "!*-pr-*", "myapp-*, !*-pr-*, *pr-123", "!*-pr-*, *pr-123", "a?c", "x, y", "*", "!b"]
NAMES = ["a", "abc", "b", "epd-1", "epd-pr-7", "myapp-test", "myapp-pr-123", "myapp-pr-456", "otherapp-pr-123", "y"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_namespace_pattern_matches_as_kopfs(pattern: str) -> None:
    ours = [n for n in NAMES if watches.matches(n, pattern)]
    kopfs = [n for n in NAMES if references.match_namespace(references.NamespaceName(n), pattern)]
    assert ours == kopfs
    assert watches.is_literal(pattern) == bool(references.select_specific_namespaces([pattern]))


def obj(name: str, uid: str = "u", **labels: str) -> dict[str, Any]:
    meta = {"name": name, "namespace": "ns", "uid": uid, "labels": labels, "managedFields": [{"manager": "x"}]}
    return {"metadata": meta, "spec": {"big": list(range(10))}}


def test_a_fresh_listing_delivers_what_went_while_the_stream_was_down() -> None:
    known = watches.Known()
    assert known.listed([obj("a"), obj("b", role="encoder")]) == [(None, obj("a")), (None, obj("b", role="encoder"))]
    known.seen("ADDED", obj("c"))
    known.seen("DELETED", obj("a"))
    again = known.listed([obj("c", uid="u2")])  # b went, and c came back as another object, while down
    assert again[0] == (None, obj("c", uid="u2"))
    b_stub = {"metadata": {"name": "b", "namespace": "ns", "uid": "u", "labels": {"role": "encoder"}}}
    assert again[1:] == [("DELETED", b_stub)], "b, as a stub: the identity, labels and owners a deletion needs"
    assert known.listed([obj("c", uid="u2")])[1:] == [], "delivered once"
    assert known.listed([]) == [("DELETED", watches.stub(obj("c", uid="u2")))]


def test_a_namespace_that_matches_is_followed_until_it_goes() -> None:
    gone: list[str] = []
    following = watches.Watches(cast(_kube.Client, None), (), listed=lambda _: None, gone=gone.append)
    seen = following._namespace_event(("epd-*",))  # no sources: following a namespace starts no stream here
    for name in ("epd-a", "other", "epd-b"):
        seen(None, {"metadata": {"name": name}})
    seen("MODIFIED", {"metadata": {"name": "epd-a", "deletionTimestamp": "now"}})  # terminating: still followed
    assert list(following.tasks) == ["epd-a", "epd-b"]
    seen("DELETED", {"metadata": {"name": "epd-a"}})
    assert list(following.tasks) == ["epd-b"] and gone == ["epd-a"]


def test_the_controller_follows_every_child_kind_and_the_model_pods() -> None:
    controller = Controller.__new__(Controller)  # its sources only; no client
    sources = Controller._sources(controller)
    by_plural = {s.kind.plural: s for s in sources}
    assert [s.kind.plural for s in sources] == [k.plural for k in apply.MANAGED_KINDS] + ["pods"]
    assert {s.kind.plural for s in sources if s.metadata_only} == {
        k.plural for k in apply.MANAGED_KINDS if k.kind not in KEPT_KINDS
    }, "status reads workloads and autoscalers whole; the rest only for repairs"
    assert {s.kind.plural for s in sources if s.kind.crd} == {"scaledobjects"}
    assert all(s.selector == CHILD_SELECTOR for s in sources[:-1])
    assert by_plural["pods"].selector == MODEL_POD_SELECTOR and not by_plural["pods"].metadata_only
    assert MODEL_POD_SELECTOR.endswith(f",{c.LABEL_MODEL_REVISION}")
    assert f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY}" in CHILD_SELECTOR
