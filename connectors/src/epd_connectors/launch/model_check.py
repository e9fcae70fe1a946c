"""Checks of a bundle against the model it serves, read from the model folder's config.json at start.

MooncakeStoreConnector shares KV blocks between instances of different TP sizes through one store layout, and
vLLM (0.33 ``mooncake/store/worker.py``, ``_select_store_layout``) takes that layout only when the model's KV
head count is a multiple of the store TP (or is 1: the replicated MQA layout). Otherwise it logs a warning and
keys blocks per local TP size, so a TP-1 and a TP-2 instance never find each other's blocks: nothing fails,
nothing is shared. Only the model's config says which, so epd-launch refuses such a start here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epd_connectors.config.bundle import RoleBundle
from epd_connectors.config.kv_transfer import MooncakeStoreConnectorConfig, connectors_of

CONFIG_FILE = "config.json"
KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num", "num_attention_groups")
"""vLLM's names for the total KV head count (CONFIG_FIELD_ALIASES["total_num_kv_heads"]), first found wins;
without any, the model has one KV head per attention head (num_attention_heads)."""


@dataclass(frozen=True)
class KVHeads:
    """The model's total KV head count and the config key it came from (for the message)."""

    count: int
    key: str


def kv_heads(config: Mapping[str, Any]) -> KVHeads | None:
    """The KV head count of a config.json's text model (a VL model nests it under text_config), or None when
    the config does not say."""
    text = config.get("text_config")
    section: Mapping[str, Any] = text if isinstance(text, Mapping) else config
    for key in (*KV_HEAD_KEYS, "num_attention_heads"):
        value = section.get(key)
        if type(value) is int and value > 0:
            where = f"text_config.{key}" if section is not config else key
            return KVHeads(value, where)
    return None


def read_model_config(model: str) -> dict[str, Any] | None:
    """The model folder's config.json, or None when `model` is no local folder with a readable one (a hub id,
    or a broken folder: vLLM then reports it in its own words)."""
    path = Path(model) / CONFIG_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def store_sharing_problem(bundle: RoleBundle, config: Mapping[str, Any]) -> str | None:
    """One line when the bundle's MooncakeStoreConnector asks to share blocks across TP sizes and the model's
    KV heads make vLLM fall back to per-TP keys; None when sharing works or is not asked for."""
    server, kv = bundle.vllm, bundle.kv_transfer
    if server is None or kv is None:
        return None
    heads = kv_heads(config)
    if heads is None or heads.count == 1:
        return None
    for child in connectors_of(kv):
        if not isinstance(child, MooncakeStoreConnectorConfig):
            continue
        extra = child.kv_connector_extra_config
        store_tp = extra.effective_store_tp()
        if store_tp is None or heads.count % store_tp == 0:
            continue
        # One TP size everywhere keys every block alike even in vLLM's fallback: nothing is lost then.
        sizes = set(extra.prefill_tp_sizes or ()) | {server.tensor_parallel_size}
        if sizes == {store_tp}:
            continue
        origin = (
            f"the LCM of prefill_tp_sizes {sorted(extra.prefill_tp_sizes)}"
            if extra.enable_store_tp_lcm and extra.prefill_tp_sizes
            else "store_tp_size"
        )
        return (
            f"model {server.model} has {heads.count} KV heads ({heads.key} in {CONFIG_FILE}), not a multiple of the "
            f"store TP {store_tp} ({origin}; this instance runs TP {server.tensor_parallel_size}), so vLLM's "
            "MooncakeStoreConnector would key KV blocks per TP size and share none between them. "
            f"Fix: give every prefill pool a TP that divides {heads.count} (decode TPs divide their LCM), or run "
            "every prefill and decode at one TP size"
        )
    return None
