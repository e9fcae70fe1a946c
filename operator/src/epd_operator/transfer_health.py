"""The transfer paths as the proxy's canaries find them: its /health read into status.transfers, and the
TransferReady condition's verdict with the fix for each failing kind of path. Pure; `transfer_watch` fetches
what this reads.

Pod readiness says each process answers; only a request that crosses a path says the path carries data. The
proxy sends those (epd_connectors.proxy.canary) and keeps failing pairs out of routing; this turns its report
into what `kubectl get` and an alert can read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from epd_operator.api.status import TransferPair, TransferStatus

FIXES = {
    "ec": (
        "the encoder's push does not reach the consumer: check that NetworkPolicies and firewalls let the encoder "
        "pods reach the consumer pods' EC control ports (ec_port and up) and their transfer engine, and that the "
        "consumer advertises its pod IP (VLLM_HOST_IP)"
    ),
    "kv": (
        "the decode does not get the prefill's KV cache: check that NetworkPolicies and firewalls let the decode "
        "pods reach the prefill pods' bootstrap port and transfer engine, and that both advertise their pod IPs"
    ),
}
"""Per path kind, what to look at."""


def transfer_status(health: Mapping[str, Any] | None, error: str = "") -> TransferStatus:
    """status.transfers from the proxy's /health answer; `error` says why there is none."""
    if error or health is None:
        return TransferStatus(reachable=False, message=error or "the proxy gave no answer")
    entries = health.get("transfers")
    if not isinstance(entries, list):
        return TransferStatus(reachable=False, message="the proxy's /health has no transfer report (an older proxy?)")
    pairs = [e for e in entries if isinstance(e, Mapping)]
    proven = [e for e in pairs if e.get("state") == "ok"]
    return TransferStatus(
        reachable=True,
        checking=health.get("canaries") != "off",
        pairs=len(pairs),
        proven=len(proven),
        failing=[_pair(e) for e in pairs if e.get("state") == "failing"],
        slowest_ms=max((float(e.get("latency_ms") or 0) for e in proven), default=0.0),
    )


def _pair(entry: Mapping[str, Any]) -> TransferPair:
    path = "kv" if entry.get("path") == "kv" else "ec"
    return TransferPair(
        path=path,
        sender=str(entry.get("from_pod") or entry.get("from") or "?"),
        receiver=str(entry.get("to_pod") or entry.get("to") or "?"),
        error=str(entry.get("error") or "")[:300],
    )


Verdict = tuple[Literal["True", "False", "Unknown"], str, str]


def verdict(transfers: TransferStatus) -> Verdict:
    """(status, reason, message) of TransferReady from the proxy's report."""
    if not transfers.reachable:
        return "Unknown", "ProxyNotReporting", f"the proxy's canary report cannot be read: {transfers.message}"
    if not transfers.checking:
        return "True", "NotChecked", "the proxy sends no canaries (spec.proxy.transferCheck.enabled is false)"
    if transfers.failing:
        return "False", "TransferFailing", describe(transfers.failing)
    if transfers.proven < transfers.pairs:
        waiting = transfers.pairs - transfers.proven
        return "Unknown", "Checking", f"{waiting} of {transfers.pairs} transfer paths not proven yet"
    if transfers.pairs == 0:
        return "True", "NothingToTransfer", "no pair of healthy instances passes data to another"
    return (
        "True",
        "TransfersProven",
        f"{transfers.proven} transfer paths proven by canaries (slowest {transfers.slowest_ms:g} ms)",
    )


def describe(failing: Sequence[TransferPair]) -> str:
    """Each failing pair with its error, then the fix for each kind of path that fails."""
    pairs = "; ".join(f"{p.path} {p.sender} -> {p.receiver}: {p.error}" for p in failing)
    fixes = " ".join(f"Fix ({kind}): {FIXES[kind]}." for kind in sorted({p.path for p in failing}))
    routed = "the proxy routes around them while another pair can serve"
    return f"{len(failing)} transfer path(s) fail their canaries ({routed}): {pairs}. {fixes}"
