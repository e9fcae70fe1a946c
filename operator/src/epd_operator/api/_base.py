"""The base of every API model: camelCase on the wire, snake_case in Python, unknown fields refused.

The Kubernetes API prunes unknown fields before we see them, but the same models also validate examples and
Helm values offline, where a typo must fail loudly.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, PlainSerializer, WithJsonSchema
from pydantic.alias_generators import to_camel

from epd_connectors.config.sizes import parse_size


class ApiModel(BaseModel):
    """camelCase aliases, frozen, extra fields forbidden; field docstrings become CRD descriptions."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )


_SIZE_UNIT = r" *([KkMmGgTt]i?[Bb]?|[Bb])? *$"
_POSITIVE_SIZE = r"^ *(0*[1-9][0-9]*([.][0-9]+)?|0*[.][0-9]*[1-9][0-9]*)" + _SIZE_UNIT
_SIZE = r"^ *[0-9]+([.][0-9]+)?" + _SIZE_UNIT


def _size_schema(minimum: int, pattern: str) -> WithJsonSchema:
    # A structural CRD allows int-or-string only bare, so the bounds are a CEL rule on the field.
    what = "positive" if minimum > 0 else "non-negative"
    return WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "x-kubernetes-validations": [
                {
                    "rule": f"type(self) == int ? self >= {minimum} : self.matches(r'{pattern}')",
                    "message": f"must be a {what} byte size: an integer or a string like '80GB', '4 GiB', '512Mi' "
                    "(units are powers of 1024)",
                }
            ],
        }
    )


def _at_least(minimum: int) -> Any:
    def check(value: int) -> int:
        if value < minimum:
            raise ValueError(f"{value} bytes is too small. Fix: give at least {minimum} byte(s)")
        return value

    return AfterValidator(check)


Quantity = Annotated[
    int,
    BeforeValidator(parse_size),
    _at_least(0),
    PlainSerializer(int, return_type=int),
    _size_schema(0, _SIZE),
]
"""A byte size: an integer of bytes or a string like "80GB", "4 GiB", "512Mi", normalised to bytes. Every unit
is a power of 1024 (GB = GiB), as Mooncake and vLLM read their own size strings, so a size copied from their
docs means the same here."""

PositiveQuantity = Annotated[
    int,
    BeforeValidator(parse_size),
    _at_least(1),
    PlainSerializer(int, return_type=int),
    _size_schema(1, _POSITIVE_SIZE),
]
"""A byte size above zero."""

ResourceList = dict[str, Annotated[str | int, WithJsonSchema({"x-kubernetes-int-or-string": True})]]
"""Kubernetes resource quantities by name (cpu, memory, nvidia.com/gpu, ...)."""


class Resources(ApiModel):
    """Compute resources of a container, as in a Pod spec."""

    requests: ResourceList = {}
    """Minimum resources the scheduler reserves."""
    limits: ResourceList = {}
    """Maximum resources the container may use."""
