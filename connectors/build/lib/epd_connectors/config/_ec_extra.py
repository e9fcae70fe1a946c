"""The ``ec_connector_extra_config`` models of the EC connectors (kept apart to keep modules small).

ECMooncakeConnector reads its settings from this dict with ``.get(key, default)`` (vLLM 0.33
``ec_connector/mooncake/config.py``); every default below is vLLM's, and every budget must be positive.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ValidationInfo, field_validator, model_validator

from epd_connectors.config import _transfer_common
from epd_connectors.config._ec_store_key import EMBEDDING_VALUE_HEADER_BYTES
from epd_connectors.config._transfer_common import TransferModel
from epd_connectors.config.base import rule_error
from epd_connectors.config.sizes import ByteSize

MooncakeProtocol = Literal["rdma", "tcp"]
BufferDevice = Literal["cuda", "cpu", "xpu"]

# Keys only a producer reads; vLLM rejects cross_encoder_cache on a consumer, and the others do nothing there.
_PRODUCER_ONLY_KEYS = (
    "cross_encoder_cache",
    "embedding_cache_prefix",
    "embedding_model_identity",
    "store_max_pending_items",
    "store_max_pending_bytes",
    "store_read_buffer_bytes",
)


class _MooncakeExtraBase(TransferModel):
    """ECMooncakeConnector settings both sides read."""

    mooncake_protocol: MooncakeProtocol = "rdma"
    """Transfer engine protocol; producer and consumer must use the same. "tcp" where there is no RDMA NIC."""

    control_timeout_s: float = 30.0
    """Seconds a control RPC (reservation, cancel) may take (vLLM default 30)."""

    push_wait_timeout_s: float = 60.0
    """Seconds a consumer waits for a pushed embedding before failing the request (vLLM default 60)."""

    @field_validator("control_timeout_s", "push_wait_timeout_s")
    @classmethod
    def _timeouts_positive(cls, value: float, info: ValidationInfo) -> float:
        return _transfer_common.check_positive(f"ec_connector_extra_config.{info.field_name}", value)


class ECMooncakeProducerExtra(_MooncakeExtraBase):
    """An encoder's ``ec_connector_extra_config`` for ECMooncakeConnector, with cross-encoder output reuse."""

    cross_encoder_cache: bool = False
    """Reuse encoder outputs other encoders published to the Mooncake store (needs MOONCAKE_CONFIG_PATH,
    Model Runner V2, TP 1, no LoRA, a multimodal processor cache, a RAM-only store). Off by default."""

    embedding_cache_prefix: str = ""
    """Namespace prefix of shared embeddings; change it when weights or output-affecting settings change."""

    embedding_model_identity: str | None = None
    """The model field of store keys; None means the configured model path (vLLM's default)."""

    store_max_pending_items: int = 32
    """Publications per encoder still in flight before new ones are skipped (vLLM default 32)."""

    store_max_pending_bytes: ByteSize = 2 * 1024**3
    """Bytes of tensors retained for in-flight publications (vLLM default 2 GiB)."""

    store_read_buffer_bytes: ByteSize = 128 * 1024**2
    """Bytes of the CPU staging buffer for store reads (vLLM default 128 MiB); larger objects are encoded."""

    @field_validator("store_max_pending_items", "store_max_pending_bytes", "store_read_buffer_bytes")
    @classmethod
    def _budgets_positive(cls, value: int, info: ValidationInfo) -> int:
        if value <= 0:
            raise rule_error(
                f"ec_connector_extra_config.{info.field_name}",
                value,
                "must be positive",
                "use a value above 0",
            )
        return value

    @field_validator("store_read_buffer_bytes")
    @classmethod
    def _read_buffer_holds_header(cls, value: int) -> int:
        # Every object starts with the 24-byte header; a smaller buffer can never hold a hit.
        if value <= EMBEDDING_VALUE_HEADER_BYTES:
            raise rule_error(
                "ec_connector_extra_config.store_read_buffer_bytes",
                value,
                f"cannot hold the {EMBEDDING_VALUE_HEADER_BYTES}-byte header of any stored embedding",
                "use at least one embedding's size (default 128 MiB)",
            )
        return value

    @field_validator("embedding_cache_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        return _transfer_common.check_key_prefix("ec_connector_extra_config.embedding_cache_prefix", value)

    @field_validator("embedding_model_identity")
    @classmethod
    def _identity(cls, value: str | None) -> str | None:
        if value is not None and (not value or "@" in value):
            raise rule_error(
                "ec_connector_extra_config.embedding_model_identity",
                value,
                "must be non-empty and free of '@' (it is a part of '@'-delimited store keys)",
                "leave it unset to use the model path, or give a plain identifier",
            )
        return value


class ECMooncakeConsumerExtra(_MooncakeExtraBase):
    """A prefill or PD instance's ``ec_connector_extra_config`` for ECMooncakeConnector."""

    @model_validator(mode="before")
    @classmethod
    def _no_producer_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in _PRODUCER_ONLY_KEYS:
                if key in data:
                    raise rule_error(
                        f"ec_connector_extra_config.{key}",
                        data[key],
                        "is an encoder (producer) setting; vLLM refuses cross_encoder_cache on a consumer",
                        "set it on the encoders' ec_transfer_config only",
                    )
        return data


class ECExampleExtra(TransferModel):
    """ECExampleConnector's ``ec_connector_extra_config``."""

    shared_storage_path: str
    """Absolute path of a folder both encoder and consumer mount; required (vLLM's /tmp is never shared)."""

    @field_validator("shared_storage_path")
    @classmethod
    def _path(cls, value: str) -> str:
        return _transfer_common.check_abs_path("ec_connector_extra_config.shared_storage_path", value)
