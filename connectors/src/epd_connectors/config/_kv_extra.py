"""The ``kv_connector_extra_config`` models of the KV connectors (kept apart to keep modules small).

vLLM 0.33's Mooncake connectors read these keys with ``.get(key, default)``; every default below is vLLM's.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from epd_connectors.config import _transfer_common
from epd_connectors.config._transfer_common import TransferModel
from epd_connectors.config.base import rule_error


def store_tp_lcm(sizes: list[int] | tuple[int, ...]) -> int:
    """The common store TP of prefillers with these TP sizes: their least common multiple (as vLLM)."""
    if not sizes or any(type(size) is not int or size <= 0 for size in sizes):
        raise ValueError(
            f"prefill_tp_sizes = {list(sizes)!r}: must be a non-empty list of positive integers. "
            "Fix: list every prefiller's tensor_parallel_size"
        )
    return math.lcm(*sizes)


class MooncakeP2PExtra(TransferModel):
    """MooncakeConnector's ``kv_connector_extra_config``."""

    mooncake_protocol: Literal["rdma", "tcp"] = "rdma"
    """Transfer engine protocol (vLLM default rdma); prefill and decode must use the same."""

    device_name: str = ""
    """RDMA device (e.g. mlx5_0); "" lets Mooncake choose."""

    num_workers: int = 10
    """Sender threads on a prefiller (vLLM default 10)."""

    kv_lease_duration: float | None = Field(default=None, gt=0)
    """vLLM 0.34: seconds a prefiller holds a request's blocks for its decoder, renewed by the decoder's
    heartbeats; the same on prefill and decode. None: no leases (vLLM's default; blocks are freed after
    VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT, 480 s)."""

    @field_validator("num_workers")
    @classmethod
    def _workers(cls, value: int) -> int:
        if value < 1:
            raise rule_error("kv_connector_extra_config.num_workers", value, "must be positive", "use 10")
        return value


def list_to_tuple(value: Any) -> Any:
    """Lists (JSON arrays) as tuples, so strict tuple fields take both."""
    return tuple(value) if isinstance(value, list) else value


class MooncakeStoreExtra(TransferModel):
    """MooncakeStoreConnector's ``kv_connector_extra_config`` (vLLM 0.33 ``mooncake/store``)."""

    cache_prefix: str = ""
    """Namespace of every store key; all instances that share prefixes must use the same (default none)."""

    load_async: bool = True
    """Load from the store asynchronously, overlapping compute and I/O (vLLM default true)."""

    lookup_async: bool = False
    """Run prefix lookups in a background thread so scheduler steps never block (vLLM default false)."""

    lookup_timeout_s: float | None = Field(default=None, gt=0)
    """vLLM 0.34: seconds a prefix lookup in the store may take before it counts as a miss (None: vLLM's 1.0;
    0.33 waits without a bound)."""

    lookup_rpc_port: int = 0
    """Number in the lookup socket's IPC path (not a TCP port); instances sharing a host and DP rank need
    different values (vLLM default 0)."""

    save_decode_cache: bool = False
    """Decode (kv_consumer) also stores its prompt prefix and finished decode blocks (default false)."""

    store_tp_size: int | None = None
    """Common store TP of endpoints with different TP sizes: >= local TP and a multiple of it. None: each
    endpoint uses its own rank-local keys (no sharing across TP sizes)."""

    enable_store_tp_lcm: bool = False
    """Derive the store TP as the LCM of prefill_tp_sizes instead of store_tp_size."""

    prefill_tp_sizes: Annotated[tuple[int, ...] | None, BeforeValidator(list_to_tuple)] = None
    """Every prefiller's TP size, the same list on every prefiller and decoder (with enable_store_tp_lcm)."""

    @field_validator("cache_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        return _transfer_common.check_key_prefix("kv_connector_extra_config.cache_prefix", value)

    @field_validator("lookup_rpc_port")
    @classmethod
    def _rpc_port(cls, value: int) -> int:
        if value < 0:
            raise rule_error("kv_connector_extra_config.lookup_rpc_port", value, "is negative", "use 0 or more")
        return value

    @field_validator("store_tp_size")
    @classmethod
    def _store_tp(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            # vLLM ignores it then and silently uses rank-local keys.
            raise rule_error("kv_connector_extra_config.store_tp_size", value, "must be positive", "use the LCM")
        return value

    @field_validator("prefill_tp_sizes")
    @classmethod
    def _sizes(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and (not value or any(size < 1 for size in value)):
            raise rule_error(
                "kv_connector_extra_config.prefill_tp_sizes",
                list(value),
                "must be a non-empty list of positive TP sizes (vLLM ignores a malformed list)",
                "list every prefiller's tensor_parallel_size",
            )
        return value

    @model_validator(mode="after")
    def _store_tp_choice(self) -> MooncakeStoreExtra:
        field = "kv_connector_extra_config"
        if self.enable_store_tp_lcm and self.prefill_tp_sizes is None:
            raise rule_error(
                f"{field}.prefill_tp_sizes",
                None,
                "enable_store_tp_lcm needs the list",
                "list every prefill TP",
            )
        if not self.enable_store_tp_lcm and self.prefill_tp_sizes is not None:
            raise rule_error(
                f"{field}.prefill_tp_sizes",
                list(self.prefill_tp_sizes),
                "has no effect without enable_store_tp_lcm",
                "set enable_store_tp_lcm true, or drop the list",
            )
        if self.enable_store_tp_lcm and self.store_tp_size is not None:
            raise rule_error(
                f"{field}.store_tp_size",
                self.store_tp_size,
                "is ignored when enable_store_tp_lcm is on",
                "set either store_tp_size or enable_store_tp_lcm with prefill_tp_sizes",
            )
        return self

    def effective_store_tp(self) -> int | None:
        """The store TP vLLM will use, or None for rank-local keys."""
        if self.enable_store_tp_lcm and self.prefill_tp_sizes:
            return store_tp_lcm(self.prefill_tp_sizes)
        return self.store_tp_size


class ExampleKVExtra(TransferModel):
    """ExampleConnector's ``kv_connector_extra_config``."""

    shared_storage_path: str
    """Absolute path of a folder prefill and decode both mount; required (vLLM's /tmp is never shared)."""

    @field_validator("shared_storage_path")
    @classmethod
    def _path(cls, value: str) -> str:
        return _transfer_common.check_abs_path("kv_connector_extra_config.shared_storage_path", value)
