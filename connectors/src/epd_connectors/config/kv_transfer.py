"""KV transfer configs, rendered to the exact JSON of vLLM's ``--kv-transfer-config``.

A prefill and a decode instance hand over the KV cache through a connector: MooncakeConnector (direct P2P),
MooncakeStoreConnector (a shared Mooncake store, also single-node offload), a MultiConnector of both (the
XpYd layout), or ExampleConnector (a shared folder; works on the CPU build). vLLM reads the connectors'
extra config as a plain dict and falls back silently on bad values (a store TP that is not a multiple of the
local TP turns cross-instance sharing off without an error), so the rules are checked here, and those that
also need the vLLM server settings in ``transfer_rules``. No KV transfer at all is ``None``: no flag is rendered.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from epd_connectors.config import _transfer_common
from epd_connectors.config._kv_extra import (
    ExampleKVExtra,
    MooncakeP2PExtra,
    MooncakeStoreExtra,
    list_to_tuple,
    store_tp_lcm,
)
from epd_connectors.config._transfer_common import TransferModel
from epd_connectors.config.base import ConfigError, describe_validation_error, problem, rule_error

__all__ = [
    "AnyKVConfig",
    "ChildKVConfig",
    "ExampleKVConnectorConfig",
    "ExampleKVExtra",
    "KVRole",
    "KVTransferConfig",
    "MooncakeConnectorConfig",
    "MooncakeP2PExtra",
    "MooncakeStoreConnectorConfig",
    "MooncakeStoreExtra",
    "MultiConnectorConfig",
    "MultiExtra",
    "connectors_of",
    "p2p_tp_fits",
    "parse_kv_transfer_config",
    "store_tp_lcm",
]

KVRole = Literal["kv_producer", "kv_consumer", "kv_both"]
BufferDevice = Literal["cuda", "cpu", "xpu"]

DEFAULT_BOOTSTRAP_PORT = 8998
"""vLLM's VLLM_MOONCAKE_BOOTSTRAP_PORT when the variable is unset."""


class _KVBase(TransferModel):
    """The KVTransferConfig fields we set (vLLM 0.33 ``vllm/config/kv_transfer.py``); the others (kv_port,
    enable_permute_local_kv, kv_connector_module_path) keep vLLM's defaults and are not offered."""

    kv_connector: str
    """vLLM's connector name (each model fixes it; declared here to keep vLLM's key order in the JSON)."""

    engine_id: str | None = None
    """Engine id for KV transfers; None lets vLLM pick a random uuid (MultiConnector children inherit it)."""

    kv_buffer_device: BufferDevice | None = None
    """Device of the connector's buffer; None lets vLLM use the platform's device ("cpu" on the CPU build)."""

    kv_role: str
    """kv_producer, kv_consumer or kv_both (each model narrows it)."""

    kv_connector_extra_config: TransferModel
    """The connector's own settings (each model narrows the type)."""

    kv_load_failure_policy: Literal["fail", "recompute"] = "fail"
    """What a failed KV load does to the request: "fail" (vLLM's default) or "recompute" the blocks. vLLM's
    scheduler reads it from the top-level config only; a MultiConnector child's value is inert."""


class MooncakeConnectorConfig(_KVBase):
    """MooncakeConnector: direct P2P KV transfer, prefill kv_producer to decode kv_consumer. Each instance
    needs its own VLLM_MOONCAKE_BOOTSTRAP_PORT on a host."""

    kv_connector: Literal["MooncakeConnector"] = "MooncakeConnector"
    """vLLM's connector name."""

    kv_role: Literal["kv_producer", "kv_consumer"]
    """kv_producer on prefill, kv_consumer on decode; required, as vLLM requires it."""

    kv_connector_extra_config: MooncakeP2PExtra = Field(default_factory=MooncakeP2PExtra)
    """Connector settings; vLLM's defaults unless given."""


class MooncakeStoreConnectorConfig(_KVBase):
    """MooncakeStoreConnector: KV blocks in a shared Mooncake store (MOONCAKE_CONFIG_PATH). Alone with
    kv_both it is single-node offload; inside a MultiConnector it is the XpYd shared prefix cache."""

    kv_connector: Literal["MooncakeStoreConnector"] = "MooncakeStoreConnector"
    """vLLM's connector name."""

    kv_role: KVRole = "kv_both"
    """kv_both for offload and on prefillers, kv_consumer on decoders (default kv_both, the offload case)."""

    kv_connector_extra_config: MooncakeStoreExtra = Field(default_factory=MooncakeStoreExtra)
    """Connector settings; vLLM's defaults unless given."""

    @model_validator(mode="after")
    def _decode_cache_on_consumer(self) -> MooncakeStoreConnectorConfig:
        # Producers store everything already; the flag only changes what a kv_consumer does.
        if self.kv_connector_extra_config.save_decode_cache and self.kv_role != "kv_consumer":
            raise rule_error(
                "kv_connector_extra_config.save_decode_cache",
                True,
                f"only affects a kv_consumer (this is {self.kv_role})",
                "set it on decoders only",
            )
        return self


class ExampleKVConnectorConfig(_KVBase):
    """ExampleConnector: KV blocks as files in a shared folder, keyed on prompt tokens (CPU build; tests)."""

    kv_connector: Literal["ExampleConnector"] = "ExampleConnector"
    """vLLM's connector name."""

    kv_role: KVRole
    """kv_producer on prefill, kv_consumer on decode; required, as vLLM requires it."""

    kv_connector_extra_config: ExampleKVExtra
    """Connector settings (the shared folder)."""


def p2p_tp_fits(producer_tp: int, consumer_tp: int) -> bool:
    """Whether MooncakeConnector can hand KV from a prefiller of one TP size to a decoder of the other: one size
    must divide the other (vLLM 0.32 and 0.33 ``_get_tp_ratio`` and ``TransferTopology.tp_ratio`` assert it on
    both sides, so an unfit pair starts fine and fails at its first transfer)."""
    return max(producer_tp, consumer_tp) % min(producer_tp, consumer_tp) == 0


_ChildConfig = MooncakeConnectorConfig | MooncakeStoreConnectorConfig | ExampleKVConnectorConfig


def _kv_tag(value: Any) -> str | None:
    connector = value.get("kv_connector") if isinstance(value, dict) else getattr(value, "kv_connector", None)
    # A non-string (a user's typo'd structure) is simply no known connector, never a TypeError.
    return connector if isinstance(connector, str) and connector in _BY_NAME else None


ChildKVConfig = Annotated[
    Annotated[MooncakeConnectorConfig, Tag("MooncakeConnector")]
    | Annotated[MooncakeStoreConnectorConfig, Tag("MooncakeStoreConnector")]
    | Annotated[ExampleKVConnectorConfig, Tag("ExampleConnector")],
    Discriminator(_kv_tag),
]
"""A connector a MultiConnector may hold (no nesting)."""

# Which child roles make sense under a MultiConnector role (the XpYd layout of the seed document).
_CHILD_ROLES: dict[str, tuple[str, ...]] = {
    "kv_producer": ("kv_producer", "kv_both"),
    "kv_consumer": ("kv_consumer",),
    "kv_both": ("kv_producer", "kv_consumer", "kv_both"),
}


class MultiExtra(TransferModel):
    """MultiConnector's ``kv_connector_extra_config``: the child connectors, tried in order for loads."""

    connectors: tuple[ChildKVConfig, ...]
    """Children in load-priority order (in XpYd MooncakeConnector first: a direct transfer beats the
    store)."""

    @field_validator("connectors", mode="before")
    @classmethod
    def _as_tuple(cls, value: Any) -> Any:
        return list_to_tuple(value)


class MultiConnectorConfig(_KVBase):
    """MultiConnector: loads from the first child that has the blocks, saves to all."""

    kv_connector: Literal["MultiConnector"] = "MultiConnector"
    """vLLM's connector name."""

    kv_role: KVRole
    """kv_producer on prefill, kv_consumer on decode; required."""

    kv_connector_extra_config: MultiExtra
    """The children."""

    @model_validator(mode="after")
    def _children(self) -> MultiConnectorConfig:
        children = self.kv_connector_extra_config.connectors
        field = "kv_connector_extra_config.connectors"
        if len(children) < 2:
            raise rule_error(field, len(children), "a MultiConnector needs two children", "use the child alone")
        names = [child.kv_connector for child in children]
        for name in set(names):
            if names.count(name) > 1:
                raise rule_error(field, names, f"lists {name} twice", "keep one of each connector")
        for i, child in enumerate(children):
            # vLLM 0.33 builds each child with KVTransferConfig(**child, engine_id=...): a child engine_id is
            # a duplicate keyword argument and the engine fails to start.
            if child.engine_id is not None:
                raise rule_error(f"{field}[{i}].engine_id", child.engine_id, "vLLM passes the parent's", "drop it")
            if child.kv_role not in _CHILD_ROLES[self.kv_role]:
                raise rule_error(
                    f"{field}[{i}].kv_role",
                    child.kv_role,
                    f"does not fit the MultiConnector's {self.kv_role}",
                    f"use one of {list(_CHILD_ROLES[self.kv_role])}",
                )
            # Children do not inherit the parent's buffer device; vLLM uses the platform default for them.
            if self.kv_buffer_device is not None and child.kv_buffer_device != self.kv_buffer_device:
                raise rule_error(
                    f"{field}[{i}].kv_buffer_device",
                    child.kv_buffer_device,
                    f"differs from the parent's {self.kv_buffer_device!r} (children do not inherit it)",
                    "set the same kv_buffer_device on every child",
                )
        return self

    def child(self, name: str) -> _ChildConfig | None:
        """The child with this connector name, if any."""
        return next((c for c in self.kv_connector_extra_config.connectors if c.kv_connector == name), None)


_BY_NAME: dict[str, type[_ChildConfig | MultiConnectorConfig]] = {
    "MooncakeConnector": MooncakeConnectorConfig,
    "MooncakeStoreConnector": MooncakeStoreConnectorConfig,
    "ExampleConnector": ExampleKVConnectorConfig,
}
_TOP_BY_NAME = {**_BY_NAME, "MultiConnector": MultiConnectorConfig}


def _top_tag(value: Any) -> str | None:
    connector = value.get("kv_connector") if isinstance(value, dict) else getattr(value, "kv_connector", None)
    return connector if isinstance(connector, str) and connector in _TOP_BY_NAME else None


KVTransferConfig = Annotated[
    Annotated[MooncakeConnectorConfig, Tag("MooncakeConnector")]
    | Annotated[MooncakeStoreConnectorConfig, Tag("MooncakeStoreConnector")]
    | Annotated[MultiConnectorConfig, Tag("MultiConnector")]
    | Annotated[ExampleKVConnectorConfig, Tag("ExampleConnector")],
    Discriminator(_top_tag),
]
"""Any KV transfer config; pydantic picks the model from kv_connector. "No KV transfer" is None."""

AnyKVConfig = _ChildConfig | MultiConnectorConfig


def parse_kv_transfer_config(text: str) -> AnyKVConfig:
    """Parse a ``--kv-transfer-config`` value into its model; ConfigError naming the fields otherwise."""
    data = _transfer_common.load_json_object(text)
    tag = _top_tag(data)
    if tag is None:
        raise ConfigError(
            [
                problem(
                    "kv_connector",
                    data.get("kv_connector"),
                    "is not a supported KV connector",
                    f"use one of {sorted(_TOP_BY_NAME)}",
                )
            ]
        )
    try:
        return _TOP_BY_NAME[tag].model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc)) from exc


def connectors_of(kv: AnyKVConfig) -> list[_ChildConfig]:
    """The leaf connectors of a config (the children of a MultiConnector, else the config itself)."""
    if isinstance(kv, MultiConnectorConfig):
        return list(kv.kv_connector_extra_config.connectors)
    return [kv]
