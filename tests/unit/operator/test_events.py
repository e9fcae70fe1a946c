"""The operator's own Event poster: the Event it writes, its order, and what it does when a post is refused."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Mapping
from typing import Any

import pytest

from epd_operator import _kube, events
from epd_operator.api import constants as c
from epd_operator.api.resource import Owner

pytestmark = pytest.mark.unit

OWNER = Owner(name="demo", namespace="serving", uid="u-1")


class Server:
    """Answers POSTs of Events with the answers queued in `refusals` first (None: accept), then accepts."""

    def __init__(self, *refusals: _kube.KubeError | None) -> None:
        self.refusals = list(refusals)
        self.tries: list[str] = []
        self.posted: list[dict[str, Any]] = []

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str = _kube.JSON,
    ) -> dict[str, Any]:
        assert (method, path) == ("POST", "/api/v1/namespaces/serving/events")
        assert isinstance(body, dict)
        self.tries.append(body["reason"])
        refusal = self.refusals.pop(0) if self.refusals else None
        if refusal is not None:
            raise refusal
        self.posted.append(body)
        return body


def _error(kind: type[_kube.KubeError], status: int) -> _kube.KubeError:
    return kind("POST", "/api/v1/namespaces/serving/events", status, "Refused", "refused")


def _post_all(server: Server, *reasons: str) -> None:
    async def run() -> None:
        poster = events.EventPoster(server)
        for reason in reasons:
            poster.post("warn" if reason.endswith("Failed") else "info", OWNER, reason, "x" * 2000)
        await asyncio.wait_for(poster.drained(), timeout=30)

    asyncio.run(run())


def test_an_event_names_its_deployment_and_the_operator() -> None:
    now = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
    body = events.event_body("warn", OWNER, "ApplyFailed", "m" * 5000, now)
    assert body["involvedObject"] == {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND,
        "name": "demo",
        "namespace": "serving",
        "uid": "u-1",
    }
    assert (body["type"], body["reason"], len(body["message"])) == ("Warning", "ApplyFailed", events.MESSAGE_MAX)
    assert body["source"] == {"component": c.MANAGED_BY} and body["reportingComponent"] == c.MANAGED_BY
    assert events.event_body("info", OWNER, "Ready", "", now)["type"] == "Normal"


def test_events_are_posted_in_the_order_asked() -> None:
    server = Server()
    _post_all(server, "Valid", "RollingOut", "Ready")
    assert [b["reason"] for b in server.posted] == ["Valid", "RollingOut", "Ready"]


def test_a_namespace_being_deleted_gets_one_try_per_event_and_no_retry() -> None:
    terminating = _error(_kube.NamespaceTerminatingError, 403)
    server = Server(terminating, _error(_kube.NotFoundError, 404))
    _post_all(server, "RollingOut", "RolesNotReady", "Ready")
    assert server.tries == ["RollingOut", "RolesNotReady", "Ready"], "each refused Event was tried once"


def test_a_busy_server_is_retried_and_other_refusals_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "RETRY_DELAYS_S", (0.0, 0.0))
    busy = _error(_kube.UnavailableError, 503)
    server = Server(busy, busy, None, _error(_kube.ForbiddenError, 403))
    _post_all(server, "Ready", "ApplyFailed", "Valid")
    assert server.tries == ["Ready", "Ready", "Ready", "ApplyFailed", "Valid"]
    assert [b["reason"] for b in server.posted] == ["Ready", "Valid"]
