"""The shared base of all config models, the one format every rule's message follows, the Port type
and the one way a host and a port make an address.

A rule's message must let a platform engineer fix the resource without reading our code, so it always names
the field, the offending value and the fix: ``<field> = <value>: <problem>. Fix: <fix>``.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo


class ConfigModel(BaseModel):
    """Immutable, strict about unknown keys (a typo must not be silently ignored), populated by field name
    or alias."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ConfigError(ValueError):
    """A configuration that cannot work; ``str()`` is one line per problem, each naming field and fix."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


def as_tuple(value: object) -> object:
    """A list as a tuple (a BeforeValidator for tuple fields of frozen models that JSON and YAML give as lists)."""
    return tuple(value) if isinstance(value, list) else value


def rule_error(field: str, value: object, problem: str, fix: str) -> ValueError:
    """The error a validator raises; pydantic keeps the message and adds the field's location. An enum value
    shows as what the user wrote ('pd'), not as the member."""
    shown = value.value if isinstance(value, Enum) else value
    return ValueError(f"{field} = {shown!r}: {problem}. Fix: {fix}")


def problem(field: str, value: object, issue: str, fix: str) -> str:
    """One rule violation as a line in the same format (for checks that collect problems instead of raising)."""
    return str(rule_error(field, value, issue, fix))


def describe_validation_error(exc: ValidationError) -> list[str]:
    """One line per error, with the dotted location of the field, for CLI output and Kubernetes conditions."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(part) for part in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{loc}: {msg}" if loc else msg)
    return lines


MAX_PORT = 65535
"""The highest TCP port number."""


def _check_port(value: int, info: ValidationInfo) -> int:
    if not 1 <= value <= MAX_PORT:
        raise rule_error(info.field_name or "port", value, "is not a TCP port", f"use a port in 1..{MAX_PORT}")
    return value


Port = Annotated[int, AfterValidator(_check_port), Field(json_schema_extra={"minimum": 1, "maximum": MAX_PORT})]
"""A TCP port in 1..65535; the JSON schema (and so the CRD) carries the same bounds."""


def address(scheme: str, host: str, port: int) -> str:
    """``scheme://host:port``, an IPv6 literal in brackets (as URLs and vLLM's make_zmq_path write it)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"
