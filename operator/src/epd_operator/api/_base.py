"""The base of every API model: camelCase on the wire, snake_case in Python, unknown fields refused.

The Kubernetes API prunes unknown fields before we see them, but the same models also validate examples and
Helm values offline, where a typo must fail loudly.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel

from epd_connectors.config.sizes import parse_size
from epd_operator.api import kube as k
from epd_operator.api.kube import SIZE_MAX, quantity_value


class ApiModel(BaseModel):
    """camelCase aliases, frozen, extra fields forbidden; field docstrings become CRD descriptions."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )


_SIZE_UNIT = r"( *([KkMmGgTt]i?[Bb]?|[Bb]))? *$"
_POSITIVE_SIZE = r"^ *(0*[1-9][0-9]*([.][0-9]+)?|0*[.][0-9]*[1-9][0-9]*)" + _SIZE_UNIT
_SIZE = r"^ *[0-9]+([.][0-9]+)?" + _SIZE_UNIT
_SIZE_MAX_LENGTH = 32
BYTE_SIZE_MARK = "x-epd-byte-size"
"""Marks a byte size in the JSON schema; the CRD generator drops it and says the format in the description."""
BYTE_SIZE_FORMAT = (
    "A byte size: a string like '80GB', '4 GiB', '512Mi' or '1048576' (every unit a power of 1024, at most 1 PiB)."
)


def _size_schema(pattern: str, what: str) -> WithJsonSchema:
    # A string, not int-or-string: kubectl explain shows int-or-string as <Object>, a string with its pattern.
    return WithJsonSchema(
        {
            "type": "string",
            BYTE_SIZE_MARK: True,
            "maxLength": _SIZE_MAX_LENGTH,
            "pattern": pattern,
            "x-kubernetes-validations": [
                {
                    "rule": f"self.matches(r'{pattern}')",
                    "message": f"must be a {what} byte size like '80GB', '4 GiB', '512Mi' or '1048576' "
                    "(units are powers of 1024; at most 1 PiB)",
                }
            ],
        }
    )


def _within(minimum: int, maximum: int) -> Any:
    def check(value: int) -> int:
        if value < minimum:
            raise ValueError(f"{value} bytes is too small. Fix: give at least {minimum} byte(s)")
        if value > maximum:
            raise ValueError(f"{value} bytes is more than any node holds. Fix: give at most 1PiB")
        return value

    return AfterValidator(check)


def size_text(n: int) -> str:
    """A byte count in the spelling the CRD takes ("4GiB"), exact: the largest binary unit dividing it."""
    for unit, factor in (("PiB", 1024**5), ("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n and n % factor == 0:
            return f"{n // factor}{unit}"
    return str(n)


Quantity = Annotated[
    int,
    BeforeValidator(parse_size),
    _within(0, SIZE_MAX),
    PlainSerializer(size_text, return_type=str),
    _size_schema(_SIZE, "non-negative"),
]
"""A byte size: a string like "80GB", "4 GiB", "512Mi" or "1048576" (an integer too, in Python), normalised to
bytes. Every unit is a power of 1024 (GB = GiB), as Mooncake and vLLM read their own size strings, so a size
copied from their docs means the same here."""

PositiveQuantity = Annotated[
    int,
    BeforeValidator(parse_size),
    _within(1, SIZE_MAX),
    PlainSerializer(size_text, return_type=str),
    _size_schema(_POSITIVE_SIZE, "positive"),
]
"""A byte size above zero."""


def _resource_problem(name: str, requests: dict[str, str | int], limits: dict[str, str | int]) -> str | None:
    """Why the API server would refuse this resource in a container, or None."""
    if name not in k.STANDARD_RESOURCES and (not re.match(k.EXTENDED_RESOURCE, name) or "kubernetes.io/" in name):
        return (
            f"{name!r} is not a container resource. Fix: use cpu, memory, ephemeral-storage or a device's name "
            "like nvidia.com/gpu"
        )
    for where, given in (("requests", requests), ("limits", limits)):
        if name in given and quantity_value(given[name]) is None:
            return (
                f"{where}[{name}] = {given[name]!r} is not a Kubernetes quantity. Fix: write it like "
                "'4Gi', '500m', '2' or '1e9' (no space, no 'B')"
            )
    if name in requests and name in limits and quantity_value(requests[name]) > quantity_value(limits[name]):  # type: ignore[operator]
        return (
            f"requests[{name}] = {requests[name]!r} is above limits[{name}] = {limits[name]!r}. "
            "Fix: request at most the limit"
        )
    if name not in k.STANDARD_RESOURCES:
        given = {**requests, **limits}
        if not re.match(r"^[0-9]+$", str(given[name])):
            return f"{name} = {given[name]!r}: a device is requested in whole units. Fix: give an integer"
        if name in requests and (name not in limits or str(requests[name]) != str(limits[name])):
            return f"requests[{name}]: a device's request must equal its limit. Fix: set it in limits (alone)"
    return None


_STANDARD = "[" + ", ".join(f"'{n}'" for n in k.STANDARD_RESOURCES) + "]"
_NAME_RULE = {
    "rule": f"self.all(n, n in {_STANDARD} || (n.matches(r'{k.EXTENDED_RESOURCE}') && !n.contains('kubernetes.io/')))",
    "message": "a container resource is cpu, memory, ephemeral-storage or a device's name like nvidia.com/gpu",
}
_DEVICE_RULE = {
    "rule": f"self.all(n, n in {_STANDARD} || string(self[n]).matches('^[0-9]+$'))",
    "message": "a device (e.g. nvidia.com/gpu) is requested in whole units: give an integer",
}
_QUANTITY_SCHEMA: dict[str, Any] = {
    "x-kubernetes-int-or-string": True,
    "maxLength": k.QUANTITY_MAX_LENGTH,
    "x-kubernetes-validations": [
        {
            "rule": f"type(self) == int ? self >= 0 : self.matches(r'{k.QUANTITY}')",
            "message": "must be a Kubernetes quantity like '4Gi', '500m', '2' or '1e9' (no space, no 'B')",
        }
    ],
}


def _resource_list_schema(what: str) -> WithJsonSchema:
    return WithJsonSchema(
        {
            "type": "object",
            "description": what,
            "maxProperties": k.MAP_MAX,
            "additionalProperties": _QUANTITY_SCHEMA,
            "x-kubernetes-validations": [_NAME_RULE, _DEVICE_RULE],
        }
    )


ResourceList = Annotated[dict[str, str | int], Field(max_length=k.MAP_MAX)]
"""Kubernetes resource quantities by name (cpu, memory, nvidia.com/gpu, ...)."""


class Resources(ApiModel):
    """Compute resources of a container, as in a Pod spec."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.requests) || !has(self.limits) || self.requests.all(n, !(n in self.limits) "
                    "|| !isQuantity(string(self.requests[n])) || !isQuantity(string(self.limits[n])) "
                    "|| quantity(string(self.requests[n])).compareTo(quantity(string(self.limits[n]))) <= 0)",
                    "message": "a request is above its limit: request at most the limit",
                },
                {
                    "rule": f"!has(self.requests) || self.requests.all(n, n in {_STANDARD} || (has(self.limits) "
                    "&& n in self.limits && string(self.limits[n]) == string(self.requests[n])))",
                    "message": "a device's request must equal its limit: set it in limits alone",
                },
            ]
        }
    )

    requests: Annotated[ResourceList, _resource_list_schema("Minimum resources the scheduler reserves.")] = {}
    """Minimum resources the scheduler reserves."""
    limits: Annotated[ResourceList, _resource_list_schema("Maximum resources the container may use.")] = {}
    """Maximum resources the container may use."""

    @model_validator(mode="after")
    def _kubernetes_accepts(self) -> Self:
        problems = [
            p
            for name in dict.fromkeys([*self.requests, *self.limits])
            if (p := _resource_problem(name, self.requests, self.limits))
        ]
        if problems:
            raise ValueError("; ".join(problems))
        return self


def _check_labels(selector: dict[str, str]) -> dict[str, str]:
    for key, value in selector.items():
        prefix, _, _ = key.rpartition("/")
        if not re.match(k.LABEL_KEY, key) or len(prefix) > 253:
            raise ValueError(
                f"{key!r} is not a label key. Fix: use [prefix/]name, name at most 63 of [A-Za-z0-9-_.] "
                "starting and ending alphanumeric, prefix a DNS subdomain"
            )
        if not re.match(k.LABEL_VALUE, value):
            raise ValueError(
                f"{key} = {value!r} is not a label value. Fix: at most 63 of [A-Za-z0-9-_.], "
                "starting and ending alphanumeric"
            )
    return selector


LabelMap = Annotated[
    dict[str, str],
    Field(max_length=k.MAP_MAX),
    AfterValidator(_check_labels),
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": k.MAP_MAX,
            "additionalProperties": {"type": "string", "maxLength": 63, "pattern": k.LABEL_VALUE},
            "x-kubernetes-validations": [
                {
                    "rule": f"self.all(key, key.matches(r'{k.LABEL_KEY}') && key.split('/')[0].size() <= 253)",
                    "message": "keys must be label keys: [prefix/]name, name at most 63 of [A-Za-z0-9-_.] "
                    "starting and ending alphanumeric",
                }
            ],
        }
    ),
]
"""Node labels a pod must match (a nodeSelector)."""


def _check_env(env: dict[str, str]) -> dict[str, str]:
    for key in env:
        if not re.match(k.ENV_NAME, key):
            raise ValueError(f"{key!r} is not an environment variable name. Fix: use letters, digits and '_'")
    return env


EnvMap = Annotated[
    dict[str, Annotated[str, Field(max_length=k.STRING_MAX)]],
    Field(max_length=k.MAP_MAX),
    AfterValidator(_check_env),
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": k.MAP_MAX,
            "additionalProperties": {"type": "string", "maxLength": k.STRING_MAX},
            "x-kubernetes-validations": [
                {
                    "rule": f"self.all(key, key.matches(r'{k.ENV_NAME}') && key.size() <= {k.STRING_MAX})",
                    "message": "names must be environment variable names: letters, digits and '_', "
                    "not starting with a digit",
                }
            ],
        }
    ),
]
"""Environment variables by name."""


def _no_backsteps(path: str) -> str:
    if ".." in path.split("/"):
        raise ValueError(
            f"{path!r} contains '..', which Kubernetes refuses in a volume path. Fix: give the path without it"
        )
    return path


NodePath = Annotated[
    str,
    Field(min_length=1, max_length=k.STRING_MAX, pattern=r"^/"),
    AfterValidator(_no_backsteps),
    WithJsonSchema(
        {
            "type": "string",
            "minLength": 1,
            "maxLength": k.STRING_MAX,
            "pattern": "^/",
            "x-kubernetes-validations": [
                {"rule": "!self.split('/').exists(s, s == '..')", "message": "a volume path may not contain '..'"}
            ],
        }
    ),
]
"""An absolute path on a node (a hostPath volume)."""
