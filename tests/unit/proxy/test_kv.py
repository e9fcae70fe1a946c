"""kv_transfer_params per KV protocol: MooncakeConnector's both sides, content-keyed connectors, returned
params (epd_connectors.proxy.kv)."""

from __future__ import annotations

import pytest

from epd_connectors.config.bundle import KVProtocol
from epd_connectors.proxy.kv import decode_params, engine_id_from_query, prefill_body

pytestmark = pytest.mark.unit


def test_prefill_gets_one_token_no_stream_and_the_mooncake_producer_side() -> None:
    body = {
        "messages": [],
        "max_tokens": 50,
        "max_completion_tokens": 50,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    out = prefill_body(body, KVProtocol.MOONCAKE, "T1")
    assert out["max_tokens"] == 1 and out["max_completion_tokens"] == 1 and out["stream"] is False
    assert "stream_options" not in out
    assert out["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": "T1"}
    assert body["max_tokens"] == 50
    assert "kv_transfer_params" not in prefill_body(body, KVProtocol.PASSIVE, "T1")


def test_mooncake_decode_side_is_built_when_the_prefill_returns_null() -> None:
    """On the CPU build the prefill answers kv_transfer_params: null (facts.md)."""
    params = decode_params(KVProtocol.MOONCAKE, "T1", bootstrap_addr="http://p0:8998", engine_id="E0", returned=None)
    assert params == {
        "do_remote_decode": False,
        "do_remote_prefill": True,
        "remote_bootstrap_addr": "http://p0:8998",
        "remote_engine_id": "E0",
        "transfer_id": "T1",
    }


def test_returned_params_are_passed_on_and_ours_win_for_mooncake() -> None:
    returned = {"remote_block_ids": [1, 2], "transfer_id": "theirs"}
    assert decode_params(KVProtocol.PASSIVE, "T1", bootstrap_addr=None, engine_id=None, returned=returned) == returned
    mooncake = decode_params(KVProtocol.MOONCAKE, "T1", bootstrap_addr="b", engine_id="E", returned=returned)
    assert mooncake is not None and mooncake["transfer_id"] == "T1" and mooncake["remote_block_ids"] == [1, 2]
    assert decode_params(KVProtocol.PASSIVE, "T1", bootstrap_addr=None, engine_id=None, returned=None) is None


def test_engine_id_from_the_bootstrap_query() -> None:
    assert engine_id_from_query({"0": {"engine_id": "E0", "worker_addr": "x"}}) == "E0"
    assert engine_id_from_query({"1": {"engine_id": "E1"}}) == "E1"
    assert engine_id_from_query({}) is None
    assert engine_id_from_query({"0": {}}) is None
    assert engine_id_from_query(None) is None
