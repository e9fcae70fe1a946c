"""Encoder-cache (EC) transfer configs, rendered to the exact JSON of vLLM's ``--ec-transfer-config``.

An encoder produces encoder-cache entries and a prefill or PD instance consumes them; both sides must agree
on the connector and its settings, and vLLM rejects a wrong combination only when the engine starts, often
with a message that names neither the flag nor the fix. The models here hold the keys of vLLM 0.33's
``ECTransferConfig`` (which forbids unknown keys) and the ``ec_connector_extra_config`` keys the
connectors read, and refuse what vLLM would refuse (or silently misuse) up front. Rules that need the vLLM
server settings too live in ``check_encoder`` / ``check_consumer``, which take both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

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
from epd_connectors.config.base import ConfigError, describe_validation_error, problem, rule_error
from epd_connectors.config.ec_ports import ec_consumer_ports, ec_control_address, zmq_tcp
from epd_connectors.config.sizes import ByteSize

if TYPE_CHECKING:
    from epd_connectors.config.vllm import VllmServerConfig

__all__ = [
    "EMBEDDING_VALUE_HEADER_BYTES",
    "BufferDevice",
    "ECExampleConnectorConfig",
    "ECExampleExtra",
    "ECMooncakeConsumer",
    "ECMooncakeConsumerExtra",
    "ECMooncakeProducer",
    "ECMooncakeProducerExtra",
    "ECTransferConfig",
    "EmbeddingHeader",
    "MooncakeProtocol",
    "check_consumer",
    "check_ec_pair",
    "check_encoder",
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

    ec_port: int = DEFAULT_EC_PORT
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

    @field_validator("ec_port")
    @classmethod
    def _port(cls, value: int) -> int:
        return _transfer_common.check_port("ec_port", value)

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

_BY_TAG: dict[str, type[ECMooncakeProducer | ECMooncakeConsumer | ECExampleConnectorConfig]] = {
    "mooncake-producer": ECMooncakeProducer,
    "mooncake-consumer": ECMooncakeConsumer,
    "example": ECExampleConnectorConfig,
}


def parse_ec_transfer_config(text: str) -> ECMooncakeProducer | ECMooncakeConsumer | ECExampleConnectorConfig:
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
    return [zmq_tcp(consumer.ec_ip, port) for port in ports]


def ec_consumer_control_address(
    consumer: ECMooncakeConsumer, tensor_parallel_size: int, data_parallel_index: int = 0
) -> str:
    """``ec_control_address`` of this consumer's ``ec_ip`` and ``ec_port``."""
    return ec_control_address(consumer.ec_ip, consumer.ec_port, tensor_parallel_size, data_parallel_index)


def check_encoder(
    ec: ECMooncakeProducer | ECMooncakeConsumer | ECExampleConnectorConfig,
    server: VllmServerConfig,
    *,
    store_offload: bool | None = False,
) -> list[str]:
    """Rules spanning an encoder's EC config and its vLLM server settings; one line per problem.

    ``store_offload`` is the vLLM-side Mooncake JSON's ``enable_offload``, or None when the encoder has no
    Mooncake store config (MOONCAKE_CONFIG_PATH) at all.
    """
    found: list[str] = []
    if server.role != "encoder":
        found.append(problem("vllm.role", server.role, "is not an encoder", "use check_consumer for it"))
    if ec.ec_role not in ("ec_producer", "ec_both") or isinstance(ec, ECMooncakeConsumer):
        found.append(problem("ec_transfer_config.ec_role", ec.ec_role, "an encoder must produce", "use ec_producer"))
    if not isinstance(ec, ECMooncakeProducer):
        return found
    # vLLM 0.33: MooncakeECConfig.from_vllm_config refuses every parallel layout on a producer.
    for field in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        size = getattr(server, field)
        if size != 1:
            found.append(
                problem(
                    f"vllm.{field}",
                    size,
                    "ECMooncakeConnector producers need 1",
                    "scale encoders by replicas",
                )
            )
    if ec.ec_connector_extra_config.cross_encoder_cache:
        found.extend(_cross_encoder_problems(server, store_offload))
    return found


def _cross_encoder_problems(server: VllmServerConfig, store_offload: bool | None) -> list[str]:
    """What cross_encoder_cache needs of the server and the store (vLLM 0.33 and the seed document)."""
    why = "cross_encoder_cache requires"
    found: list[str] = []
    if server.use_v2_model_runner is not True:
        found.append(
            problem(
                "vllm.use_v2_model_runner",
                server.use_v2_model_runner,
                f"{why} Model Runner V2 (left unset vLLM may fall back to V1)",
                "set it to true (VLLM_USE_V2_MODEL_RUNNER=1)",
            )
        )
    if server.enable_lora:
        found.append(problem("vllm.enable_lora", True, f"{why} no LoRA", "disable LoRA on encoders"))
    if server.mm_processor_cache_gb <= 0:
        found.append(
            problem(
                "vllm.mm_processor_cache_gb",
                server.mm_processor_cache_gb,
                f"{why} a multimodal processor cache to keep content identifiers",
                "set it above 0 (vLLM default 4)",
            )
        )
    if store_offload is None:
        found.append(
            problem(
                "mooncake store",
                None,
                f"{why} a Mooncake store (MOONCAKE_CONFIG_PATH) on every encoder",
                "configure the store for the encoders",
            )
        )
    elif store_offload:
        found.append(
            problem(
                "mooncake.enable_offload",
                True,
                f"{why} a RAM-only store",
                "set enable_offload false in the encoders' Mooncake JSON",
            )
        )
    return found


def check_consumer(
    ec: ECMooncakeProducer | ECMooncakeConsumer | ECExampleConnectorConfig, server: VllmServerConfig
) -> list[str]:
    """Rules spanning a prefill/PD instance's EC config and its vLLM server settings; one line per problem."""
    found: list[str] = []
    if server.role not in ("prefill", "pd"):
        found.append(
            problem("vllm.role", server.role, "only prefill and pd consume encoder output", "drop the EC config")
        )
    if ec.ec_role not in ("ec_consumer", "ec_both") or isinstance(ec, ECMooncakeProducer):
        found.append(
            problem(
                "ec_transfer_config.ec_role",
                ec.ec_role,
                "a prefill/PD instance must consume",
                "use ec_consumer",
            )
        )
    if isinstance(ec, ECMooncakeConsumer):
        tp, dp = server.tensor_parallel_size, server.data_parallel_size
        highest = ec.ec_port + dp * tp - 1
        if highest > _transfer_common.MAX_PORT:
            found.append(
                problem(
                    "ec_transfer_config.ec_port",
                    ec.ec_port,
                    f"the control ports reach {highest} (ec_port + dp*tp - 1 with tp {tp}, dp {dp})",
                    f"use an ec_port of at most {_transfer_common.MAX_PORT - dp * tp + 1}",
                )
            )
        ports = set(ec_consumer_ports(ec.ec_port, tp, dp))
        for field, port in (
            ("vllm.port", server.port),
            ("vllm.mooncake_bootstrap_port", server.mooncake_bootstrap_port),
        ):
            if port is not None and port in ports:
                found.append(
                    problem(
                        field,
                        port,
                        "collides with an EC control port",
                        "move one of them (ports must differ)",
                    )
                )
    return found


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
