"""The kv_transfer_params the prefill and the decode get, per KV hand-over protocol (pure).

MooncakeConnector (P2P) needs both sides named with one transfer id: the prefill produces for a remote decode,
the decode pulls from the prefill's bootstrap server and engine (vLLM's mooncake_connector_proxy protocol;
facts.md). On the CPU build the prefill answers `kv_transfer_params: null`, so the proxy builds the decode's
params itself. Connectors that find the KV by content (ExampleConnector, MooncakeStoreConnector) need nothing
from us; a prefill that does return params (NIXL-style) has them passed on to the decode.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from epd_connectors.config.bundle import KVProtocol


def prefill_body(body: Mapping[str, Any], protocol: KVProtocol, transfer_id: str) -> dict[str, Any]:
    """The prefill request: one token, not streamed, announcing a remote decode for MooncakeConnector."""
    out = {**body, "max_tokens": 1, "stream": False}
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out.pop("stream_options", None)
    if protocol is KVProtocol.MOONCAKE:
        out["kv_transfer_params"] = {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "transfer_id": transfer_id,
        }
    return out


def decode_params(
    protocol: KVProtocol,
    transfer_id: str,
    *,
    bootstrap_addr: str | None,
    engine_id: str | None,
    returned: Any,
) -> dict[str, Any] | None:
    """What the decode gets as kv_transfer_params; None for nothing.

    `returned` is the prefill answer's kv_transfer_params (None on the CPU build). For MooncakeConnector the
    proxy's own params win over returned ones for the keys it owns, so one transfer id names both sides.
    """
    base: dict[str, Any] = dict(returned) if isinstance(returned, Mapping) else {}
    if protocol is KVProtocol.MOONCAKE:
        base.update(
            {
                "do_remote_decode": False,
                "do_remote_prefill": True,
                "remote_bootstrap_addr": bootstrap_addr,
                "remote_engine_id": engine_id,
                "transfer_id": transfer_id,
            }
        )
    return base or None


def engine_id_from_query(answer: Any) -> str | None:
    """The prefill engine id from its bootstrap server's GET /query answer: `{"0": {"engine_id": ...}}`
    (keyed by data-parallel rank; rank 0 is the one the proxy addresses unless it names a rank)."""
    if not isinstance(answer, Mapping) or not answer:
        return None
    entry = answer.get("0")
    if entry is None:
        entry = answer[sorted(answer, key=str)[0]]
    if isinstance(entry, Mapping) and isinstance(entry.get("engine_id"), str):
        return str(entry["engine_id"])
    return None
