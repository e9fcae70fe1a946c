"""What discovery says when the API server refuses or fails it: a refusal is one line naming the status, the
account, the resource and the fix, never a traceback; another error gets one traceback per run of the same
error; the pause between attempts doubles up to a cap; an expired watch lists again at once.

In process, with the stand-in client of tests.proxy.kube_stand_in (its errors have the client's shape).
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from epd_connectors.config.roles import Role
from epd_connectors.proxy import discovery
from epd_connectors.proxy.app import ProxyApp
from epd_connectors.proxy.discovery import Failures, kubernetes_discovery
from epd_connectors.proxy.discovery_slices import RoleWatch
from epd_connectors.proxy.roster import Roster
from tests.proxy.harness import FAST, run
from tests.proxy.kube_stand_in import ApiError, StandInKubernetes, forbidden, slice_

ACCOUNT = "system:serviceaccount:ns:vl-proxy"
WHAT = "epd_connectors.proxy.discovery"


def records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == WHAT and r.levelno >= logging.WARNING]


def test_a_refused_proxy_logs_one_line_per_attempt_and_fills_its_roster_once_allowed(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(discovery, "RETRY_S", 0.01)
    kube = StandInKubernetes(
        listed=[slice_("pd-a", "vl-pd", ("10.0.1.1", True))],
        failures={"vl-pd": [forbidden("ns", ACCOUNT), forbidden("ns", ACCOUNT), forbidden("ns", ACCOUNT)]},
    )
    roster = Roster.build({Role.PD: []})
    lists: dict[str, int] = {}

    async def main() -> None:
        watches = [RoleWatch(Role.PD, "vl-pd", port=8000)]
        app = ProxyApp(
            roster, FAST, discovery=kubernetes_discovery("ns", watches, client_loader=lambda: kube), probe=False
        )
        await app.startup()
        try:
            for _ in range(300):
                if roster.instances(Role.PD):
                    break
                await asyncio.sleep(0.01)
            lists.update(kube.lists)
        finally:
            kube.done.set()
            await app.shutdown()

    with caplog.at_level(logging.INFO, logger=WHAT):
        run(main)
    assert [i.url for i in roster.instances(Role.PD)] == ["http://10.0.1.1:8000"], "recovered, no restart"
    assert lists == {"vl-pd": 4}, "three refusals, then the list that filled the roster"
    refused = records(caplog)
    assert len(refused) == 3
    for record in refused:
        line = record.getMessage()
        assert record.levelno == logging.WARNING and record.exc_info is None and "\n" not in line
        assert line.startswith("EndpointSlices of ns/vl-pd refused: 403 Forbidden for " + ACCOUNT)
        assert 'cannot list resource \\"endpointslices\\"' in line, "the API's own words, JSON-quoted"
        assert "Role must allow get, list and watch on endpointslices (discovery.k8s.io) in namespace ns" in line
        assert f"RoleBinding must bind that Role to {ACCOUNT}" in line


def test_an_unauthorized_proxy_is_told_to_look_at_its_token() -> None:
    line = discovery.refusal(ApiError(401, "Unauthorized", "Unauthorized"), "EndpointSlices of ns/vl-pd", "ns", 2.0)
    assert line.startswith("EndpointSlices of ns/vl-pd refused: 401 Unauthorized for the proxy's account: ")
    assert "ServiceAccount token" in line and line.endswith("retrying in 2 s")


def test_pauses_double_to_the_cap_and_reset_once_the_watch_delivers() -> None:
    failures = Failures("ns", "vl-pd")
    refused = forbidden("ns", ACCOUNT)
    pauses = [failures.record(refused) for _ in range(6)]
    assert pauses == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    failures.clear()
    assert failures.record(refused) == 2.0


def test_another_error_gets_one_traceback_per_run_of_the_same_error(caplog: pytest.LogCaptureFixture) -> None:
    failures = Failures("ns", "vl-pd")
    refused = OSError("connect to <urllib3.connection.HTTPConnection object at 0x7f00aa> refused")
    again = OSError("connect to <urllib3.connection.HTTPConnection object at 0x7f00bb> refused")
    with caplog.at_level(logging.WARNING, logger=WHAT):
        for error in (refused, again, again, ApiError(500, "Internal Server Error"), refused):
            failures.record(error)
    logged = records(caplog)
    assert [r.exc_info is not None for r in logged] == [True, False, False, True, True]
    assert "OSError: connect to <urllib3.connection.HTTPConnection object> refused again" in logged[1].getMessage()
    assert all("\n" not in r.getMessage() for r in logged)


def test_an_expired_watch_lists_again_at_once_but_not_in_a_loop(caplog: pytest.LogCaptureFixture) -> None:
    failures = Failures("ns", "vl-pd")
    gone = ApiError(410, "Expired: too old resource version")
    with caplog.at_level(logging.WARNING, logger=WHAT):
        assert failures.record(gone) == 0.0
    assert records(caplog) == []
    assert failures.record(gone) == 2.0, "a second 410 in a row waits like any other error"
