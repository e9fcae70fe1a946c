"""The proxy's canary report read into status.transfers, and TransferReady with Ready waiting for it."""

from __future__ import annotations

from typing import Any

from epd_operator import status
from epd_operator.api import constants as c
from epd_operator.api.status import EPDDeploymentStatus, TransferStatus
from epd_operator.render import Derived
from epd_operator.transfer_health import transfer_status, verdict


def entry(sender: str, receiver: str, state: str, **extra: Any) -> dict[str, Any]:
    return {"path": "ec", "from": f"http://{sender}:8000", "to": f"http://{receiver}:8000", "state": state} | extra


def health(*entries: dict[str, Any], canaries: str = "on") -> dict[str, Any]:
    return {"status": "healthy", "roles": {}, "canaries": canaries, "transfers": list(entries)}


def test_the_report_counts_pairs_names_failing_pods_and_the_slowest_proven_canary() -> None:
    report = transfer_status(
        health(
            entry("10.0.0.1", "10.0.0.3", "ok", latency_ms=120.5, from_pod="enc-a", to_pod="pre-a"),
            entry("10.0.0.2", "10.0.0.3", "failing", error="no answer within 10 s", from_pod="enc-b", to_pod="pre-a"),
            entry("10.0.0.1", "10.0.0.4", "unchecked"),
            {"path": "kv", "from": "http://p", "to": "http://d", "state": "ok", "latency_ms": 80.0},
        )
    )
    assert (report.reachable, report.checking, report.pairs, report.proven, report.slowest_ms) == (
        True,
        True,
        4,
        2,
        120.5,
    )
    (failing,) = report.failing
    assert (failing.path, failing.sender, failing.receiver) == ("ec", "enc-b", "pre-a")
    assert failing.error == "no answer within 10 s"


def test_transfer_ready_says_which_pair_fails_and_what_to_fix() -> None:
    failing = transfer_status(health(entry("a", "b", "failing", error="500", from_pod="enc-1", to_pod="pd-0")))
    state, reason, message = verdict(failing)
    assert (state, reason) == ("False", "TransferFailing")
    assert "ec enc-1 -> pd-0: 500" in message and "EC control ports" in message and "routes around them" in message
    assert verdict(transfer_status(health(entry("a", "b", "ok", latency_ms=3.0))))[:2] == ("True", "TransfersProven")
    assert verdict(transfer_status(health(entry("a", "b", "unchecked"))))[:2] == ("Unknown", "Checking")
    assert verdict(transfer_status(health(canaries="off")))[:2] == ("True", "NotChecked")
    assert verdict(transfer_status(None, error="refused"))[:2] == ("Unknown", "ProxyNotReporting")
    assert not transfer_status({"status": "healthy"}).reachable, "a proxy without a report is not a proven one"


def derived(*, required: bool, url: str | None = "http://proxy:8000/health") -> Derived:
    return Derived(
        tenant_id="t",
        python_hash_seed=0,
        endpoint="http://proxy:8000",
        model_revision="rev",
        proxy_health_url=url,
        transfers_required=required,
    )


def facts(transfers: TransferStatus | None, d: Derived) -> status.Facts:
    return status.Facts(
        generation=1,
        problems=[],
        observed=[],
        derived=d,
        previous=EPDDeploymentStatus(),
        now="2026-12-02T00:00:00Z",
        transfers=transfers,
    )


def conditions(st: EPDDeploymentStatus) -> dict[str, tuple[str, str]]:
    return {x.type: (x.status, x.reason) for x in st.conditions}


def test_ready_waits_for_transfer_ready_unless_the_spec_says_not_to() -> None:
    failing = transfer_status(health(entry("a", "b", "failing", error="x")))
    held = status.compute(facts(failing, derived(required=True)))
    assert conditions(held)[c.COND_TRANSFER_READY] == ("False", "TransferFailing")
    assert conditions(held)[c.COND_READY] == ("False", status.REASON_ROLES_NOT_READY)
    assert (
        "TransferReady: 1 transfer path(s) fail" in next(x for x in held.conditions if x.type == c.COND_READY).message
    )
    assert held.transfers == failing

    free = status.compute(facts(failing, derived(required=False)))
    assert conditions(free)[c.COND_TRANSFER_READY] == ("False", "TransferFailing")
    assert conditions(free)[c.COND_READY][0] == "True"

    proven = status.compute(facts(transfer_status(health(entry("a", "b", "ok"))), derived(required=True)))
    assert conditions(proven)[c.COND_READY][0] == "True"


def test_without_canaries_or_without_reading_them_transfer_ready_holds_nothing_back() -> None:
    off = status.compute(facts(None, derived(required=False, url=None)))
    assert conditions(off)[c.COND_TRANSFER_READY] == ("True", status.REASON_NOT_REQUIRED)
    unread = status.compute(facts(None, derived(required=True)))
    assert conditions(unread)[c.COND_TRANSFER_READY] == ("True", "NotRead")
    assert conditions(unread)[c.COND_READY][0] == "True"
    waiting = status.compute(facts(TransferStatus(reachable=False, message="not read yet"), derived(required=True)))
    assert conditions(waiting)[c.COND_TRANSFER_READY] == ("Unknown", "ProxyNotReporting")
    assert conditions(waiting)[c.COND_READY][0] == "False"
