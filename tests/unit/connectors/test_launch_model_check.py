"""How epd-launch reads a model's KV head count from its config.json: vLLM's own key names, in its order, in the
text model's section (the subprocess tests with real config files are in tests/e2e/test_launch_model_check.py)."""

from __future__ import annotations

import pytest

from epd_connectors.launch.model_check import KVHeads, kv_heads

pytestmark = pytest.mark.unit


def test_the_head_count_is_read_as_vllm_reads_it() -> None:
    vl = {"model_type": "qwen2_vl", "text_config": {"num_attention_heads": 2, "num_key_value_heads": 1}}
    assert kv_heads(vl) == KVHeads(1, "text_config.num_key_value_heads")
    assert kv_heads({"num_attention_heads": 8}) == KVHeads(8, "num_attention_heads")  # MHA: no KV key at all
    assert kv_heads({"num_key_value_heads": 4, "num_attention_heads": 8}) == KVHeads(4, "num_key_value_heads")
    assert kv_heads({"multi_query_group_num": 2, "num_attention_heads": 32}) == KVHeads(2, "multi_query_group_num")
    assert kv_heads({"n_head_kv": 1, "num_kv_heads": 8}) == KVHeads(1, "n_head_kv")  # vLLM's first alias wins
    assert kv_heads({"architectures": ["X"]}) is None
    assert kv_heads({"num_key_value_heads": True}) is None  # a bool is no count
