"""Encoder-cache (EC) transfer configs, rendered to the exact JSON of vLLM's ``--ec-transfer-config``.

An encoder produces encoder-cache entries and a prefill or PD instance consumes them; both sides must agree
on the connector and its settings, and vLLM rejects a wrong combination only when the engine starts, often
with a message that names neither the flag nor the fix. The models here hold the keys of vLLM 0.33's
``ECTransferConfig`` (which forbids unknown keys) and the ``ec_connector_extra_config`` keys the
connectors read, and refuse what vLLM would refuse (or silently misuse) up front. Rules that need the vLLM
server settings too live above both, in ``transfer_rules``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, ValidationError, field_validator

from epd_connectors.config import _transfer_common
from epd_connectors.config._ec_extra import (
    BufferDevice,
    ECExampleExtra,
    ECMooncakeConsumerExtra,
    ECMooncakeProducerExtra,
    MooncakeProtocol,
)
from epd_connectors.config._ec_store_key import (
    EMBEDDING_VALUE_HEADER_BYTES,
    EmbeddingHeader,
    embedding_key,
    embedding_namespace,
    embedding_value_header,
    embedding_value_size,
    parse_embedding_value_header,
)
from epd_connectors.config._transfer_common import TransferModel
from epd_connectors.config.base import ConfigError, Port, address, describe_validation_error, problem, rule_error
from epd_connectors.config.ec_ports import ec_consumer_ports, ec_control_address
from epd_connectors.config.sizes import ByteSize

__all__ = [
    "EMBEDDING_VALUE_HEADER_BYTES",
    "BufferDevice",
    "ECConfig",
    "ECExampleConnectorConfig",
    "ECExampleExtra",
    "ECMooncakeConsumer",
    "ECMooncakeConsumerExtra",
    "ECMooncakeProducer",
    "ECMooncakeProducerExtra",
    "ECTransferConfig",
    "EmbeddingHeader",
    "MooncakeProtocol",
    "check_ec_pair",
    "ec_consumer_addresses",
    "ec_consumer_control_address",
    "ec_consumer_ports",
    "embedding_key",
    "embedding_namespace",
    "embedding_value_header",
    "embedding_value_size",
    "parse_ec_transfer_config",
    "parse_embedding_value_header",
]

DEFAULT_EC_PORT = 14579
"""vLLM's default ``ec_port``: the base of a consumer's control ports."""

DEFAULT_EC_BUFFER_SIZE = 1_000_000_000
"""vLLM's default ``ec_buffer_size`` (1e9 bytes): ECMooncakeConnector's registered transfer pool."""


class _ECBase(TransferModel):
    """The ECTransferConfig fields every connector shares (vLLM 0.33 ``vllm/config/ec_transfer.py``).

    vLLM 0.33 has no ``ec_rank`` / ``ec_parallel_size`` fields and rejects unknown keys, so neither exists
    here.
    """

    ec_connector: str
    """vLLM's connector name (each model fixes it; declared here to keep vLLM's key order in the JSON)."""

    engine_id: str | None = None
    """Engine id for EC transfers; None lets vLLM pick a random uuid (nothing of ours needs it stable)."""

    ec_buffer_device: BufferDevice = "cuda"
    """Where ECMooncakeConnector keeps its registered transfer pool; "cpu" on CPU-only machines."""

    ec_buffer_size: ByteSize = DEFAULT_EC_BUFFER_SIZE
    """Bytes of the registered transfer pool (vLLM default 1e9); a size string such as "2 GiB" works."""

    ec_role: str
    """ec_producer, ec_consumer or ec_both (each model narrows it)."""

    ec_ip: str = "127.0.0.1"
    """Consumer: the address its control server binds and advertises (the pod IP). vLLM's default."""

    ec_port: Port = DEFAULT_EC_PORT
    """Consumer: control port of TP rank 0 of DP replica 0 (rank r of replica d: ec_port + d*tp + r)."""

    ec_connector_extra_config: TransferModel
    """The connector's own settings (each model narrows the type)."""

    ec_connector_module_path: str | None = None
    """Python module to load an out-of-tree connector from; None for vLLM's built-in connectors."""

    @field_validator("ec_buffer_size")
    @classmethod
    def _buffer_positive(cls, value: int) -> int:
        # ECMooncakeConnector registers exactly this many bytes; zero or less fails at engine start.
        if value <= 0:
            raise rule_error("ec_buffer_size", value, "must be positive", "use at least one embedding's bytes")
        return value

    @field_validator("ec_ip")
    @classmethod
    def _ip(cls, value: str) -> str:
        if not value.strip():
            raise rule_error("ec_ip", value, "is empty", "give the pod's IP (downward API status.podIP)")
        return value


class ECMooncakeProducer(_ECBase):
    """An encoder's ECMooncakeConnector config: pushes embeddings to consumers over Mooncake P2P."""

    ec_connector: Literal["ECMooncakeConnector"] = "ECMooncakeConnector"
    """vLLM's connector name."""

    ec_role: Literal["ec_producer"] = "ec_producer"
    """Producer only: cross-encoder reuse needs an encoder-only producer, so ec_both is not offered."""

    ec_connector_extra_config: ECMooncakeProducerExtra = Field(default_factory=ECMooncakeProducerExtra)
    """Connector settings; vLLM's defaults unless given."""


class ECMooncakeConsumer(_ECBase):
    """A prefill or PD instance's ECMooncakeConnector config: receives pushed embeddings."""

    ec_connector: Literal["ECMooncakeConnector"] = "ECMooncakeConnector"
    """vLLM's connector name."""

    ec_role: Literal["ec_consumer"] = "ec_consumer"
    """Consumer: the instance that runs the language model."""

    ec_connector_extra_config: ECMooncakeConsumerExtra = Field(default_factory=ECMooncakeConsumerExtra)
    """Connector settings; vLLM's defaults unless given."""


class ECExampleConnectorConfig(_ECBase):
    """ECExampleConnector: embeddings as safetensors files in a shared folder (works on the CPU build)."""

    ec_connector: Literal["ECExampleConnector"] = "ECExampleConnector"
    """vLLM's connector name."""

    ec_role: Literal["ec_producer", "ec_consumer", "ec_both"]
    """ec_producer on encoders, ec_consumer on prefill/PD; required, as vLLM requires it."""

    ec_connector_extra_config: ECExampleExtra
    """Connector settings (the shared folder)."""


def _ec_tag(value: Any) -> str | None:
    """Which model a raw dict or a model instance is (connector plus role)."""
    if isinstance(value, dict):
        connector, role = value.get("ec_connector"), value.get("ec_role")
    else:
        connector, role = getattr(value, "ec_connector", None), getattr(value, "ec_role", None)
    if connector == "ECExampleConnector":
        return "example"
    if connector == "ECMooncakeConnector" and role in ("ec_producer", "ec_consumer"):
        return f"mooncake-{role.removeprefix('ec_')}"
    return None


ECTransferConfig = Annotated[
    Annotated[ECMooncakeProducer, Tag("mooncake-producer")]
    | Annotated[ECMooncakeConsumer, Tag("mooncake-consumer")]
    | Annotated[ECExampleConnectorConfig, Tag("example")],
    Discriminator(_ec_tag),
]
"""Any EC transfer config; pydantic picks the model from ec_connector and ec_role."""

ECConfig = ECMooncakeProducer | ECMooncakeConsumer | ECExampleConnectorConfig
"""A parsed EC transfer config of any connector and role."""

_BY_TAG: dict[str, type[ECConfig]] = {
    "mooncake-producer": ECMooncakeProducer,
    "mooncake-consumer": ECMooncakeConsumer,
    "example": ECExampleConnectorConfig,
}


def parse_ec_transfer_config(text: str) -> ECConfig:
    """Parse an ``--ec-transfer-config`` value into its model; ConfigError naming the fields otherwise."""
    data = _transfer_common.load_json_object(text)
    tag = _ec_tag(data)
    if tag is None:
        raise ConfigError(
            [
                problem(
                    "ec_connector/ec_role",
                    (data.get("ec_connector"), data.get("ec_role")),
                    "is not a supported EC connector and role",
                    "use ECMooncakeConnector with ec_producer or ec_consumer, or ECExampleConnector",
                )
            ]
        )
    try:
        return _BY_TAG[tag].model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc)) from exc


def ec_consumer_addresses(
    consumer: ECMooncakeConsumer, tensor_parallel_size: int, data_parallel_size: int = 1
) -> list[str]:
    """Every control address a consumer listens on (``tcp://ec_ip:port``), in ``ec_consumer_ports`` order."""
    ports = ec_consumer_ports(consumer.ec_port, tensor_parallel_size, data_parallel_size)
    return [address("tcp", consumer.ec_ip, port) for port in ports]


def ec_consumer_control_address(
    consumer: ECMooncakeConsumer, tensor_parallel_size: int, data_parallel_index: int = 0
) -> str:
    """``ec_control_address`` of this consumer's ``ec_ip`` and ``ec_port``."""
    return ec_control_address(consumer.ec_ip, consumer.ec_port, tensor_parallel_size, data_parallel_index)


def check_ec_pair(
    producer: ECMooncakeProducer | ECExampleConnectorConfig,
    consumer: ECMooncakeConsumer | ECExampleConnectorConfig,
) -> list[str]:
    """Rules between an encoder's and a consumer's EC configs: same connector, same transport settings."""
    if producer.ec_connector != consumer.ec_connector:
        return [
            problem(
                "ec_transfer_config.ec_connector",
                (producer.ec_connector, consumer.ec_connector),
                "encoder and consumer use different connectors",
                "use one EC connector for the whole deployment",
            )
        ]
    found: list[str] = []
    if isinstance(producer, ECMooncakeProducer) and isinstance(consumer, ECMooncakeConsumer):
        a, b = producer.ec_connector_extra_config, consumer.ec_connector_extra_config
        if a.mooncake_protocol != b.mooncake_protocol:
            found.append(
                problem(
                    "ec_connector_extra_config.mooncake_protocol",
                    (a.mooncake_protocol, b.mooncake_protocol),
                    "encoder and consumer use different transfer protocols",
                    "use one protocol on both",
                )
            )
    elif isinstance(producer, ECExampleConnectorConfig) and isinstance(consumer, ECExampleConnectorConfig):
        a_path = producer.ec_connector_extra_config.shared_storage_path
        b_path = consumer.ec_connector_extra_config.shared_storage_path
        if a_path != b_path:
            found.append(
                problem(
                    "ec_connector_extra_config.shared_storage_path",
                    (a_path, b_path),
                    "encoder and consumer look in different folders",
                    "mount one shared volume at one path on both",
                )
            )
    return found
