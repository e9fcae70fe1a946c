"""What the EC and KV transfer configs share: their JSON rendering and parsing, and small field checks.

vLLM parses ``--ec-transfer-config`` and ``--kv-transfer-config`` into pydantic dataclasses that forbid
unknown keys, and the connectors then read ``*_extra_config`` as a plain dict with ``.get(key, default)``,
so a wrong type there (``"false"`` for a bool) is silently truthy. The transfer models are therefore strict
(no coercion from strings) and render exactly the keys vLLM's dataclasses declare.
"""

from __future__ import annotations

import json
from typing import Any, Self

from pydantic import ConfigDict, ValidationError

from epd_connectors.config.base import ConfigError, ConfigModel, describe_validation_error, rule_error

TRANSFER_MODEL_CONFIG = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)
"""Strict: vLLM's connectors read extra-config values as they are, so "5" must not pass for 5."""


class TransferModel(ConfigModel):
    """A transfer config that renders to the one-line JSON its vLLM flag takes, and parses back from it."""

    model_config = TRANSFER_MODEL_CONFIG

    def to_cli_json(self) -> str:
        """The flag's value: compact JSON, keys in vLLM's field order, unset optional fields left out (vLLM
        then applies its own default, e.g. a fresh engine_id)."""
        return json.dumps(self.model_dump(mode="json", exclude_none=True), separators=(",", ":"))

    @classmethod
    def from_cli_json(cls, text: str) -> Self:
        """Parse the flag's value back; raises ConfigError with one line per problem."""
        data = load_json_object(text)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(exc)) from exc


def load_json_object(text: str) -> dict[str, Any]:
    """The JSON object a transfer flag holds; ConfigError when it is not valid JSON or not an object."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, TypeError) as exc:
        raise ConfigError(
            [str(rule_error("transfer config", text, f"is not valid JSON ({exc})", "pass a JSON object"))]
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError(
            [str(rule_error("transfer config", data, "is not a JSON object", "pass a JSON object ({...})"))]
        )
    return data


def check_positive(field: str, value: float) -> float:
    """A strictly positive, finite number (vLLM rejects zero, negative, inf and nan budgets)."""
    if not (value > 0 and value != float("inf")):
        raise rule_error(field, value, "must be a positive finite number", "use a value greater than 0")
    return value


def check_key_prefix(field: str, value: str) -> str:
    """A store-key namespace prefix: '@' separates the parts of Mooncake keys, so a prefix holding one could
    make two different namespaces produce the same key."""
    if "@" in value or any(ch.isspace() for ch in value):
        raise rule_error(
            field,
            value,
            "must not contain '@' or whitespace (they delimit store keys)",
            "use [A-Za-z0-9._:/-]",
        )
    return value


def check_abs_path(field: str, value: str) -> str:
    """A folder every process sees at the same absolute path (vLLM's default, /tmp, is never shared)."""
    if not value.startswith("/"):
        raise rule_error(field, value, "is not an absolute path", "mount a shared volume and give its path")
    return value
