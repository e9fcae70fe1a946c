"""Store TP: the common tensor-parallel layout of KV blocks in the store.

MooncakeStoreConnector keys blocks by store TP rank; prefillers with different TP sizes share blocks only when
every prefiller and decoder uses the same store TP, the LCM of all prefill TP sizes (vLLM computes it from
prefill_tp_sizes with enable_store_tp_lcm). The list is therefore derived once and given to every role.
"""

from __future__ import annotations

from epd_connectors.config.kv_transfer import store_tp_lcm
from epd_operator.api.spec import PrefillSpec


def prefill_tp_sizes(prefill: PrefillSpec) -> tuple[int, ...]:
    """Every prefill pool's TP size (main pool and additionalPools), sorted and unique: a stable list, so the
    bundles (and their rollout hashes) do not change when pools are merely reordered."""
    return tuple(sorted({prefill.tensor_parallel_size, *(p.tensor_parallel_size for p in prefill.additional_pools)}))


def store_tp_size(sizes: tuple[int, ...]) -> int:
    """The LCM of the prefill TP sizes, exactly as vLLM computes it (the connector library's helper)."""
    return store_tp_lcm(sizes)
