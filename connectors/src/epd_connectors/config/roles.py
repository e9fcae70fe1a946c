"""The roles of an E/P/D deployment, named once: what a pod runs, what the proxy routes to, what vLLM serves."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Final

from pydantic import BeforeValidator

from epd_connectors.config.base import rule_error


class Role(StrEnum):
    """What one pod runs. `pd` is a combined prefill+decode instance (no separate prefill pool)."""

    MASTER = "master"
    STORE_CLIENT = "store-client"
    ENCODER = "encoder"
    PREFILL = "prefill"
    DECODE = "decode"
    PD = "pd"
    PROXY = "proxy"


VLLM_ROLES: Final = frozenset({Role.ENCODER, Role.PREFILL, Role.DECODE, Role.PD})
"""The roles that run a vLLM server (and that the proxy routes to)."""


def _vllm_role(value: object) -> object:
    # Before validation, so that strict models (no str-to-enum coercion) still take a role by its name.
    if isinstance(value, str) and value in VLLM_ROLES:
        return Role(value)
    if isinstance(value, Role) and value in VLLM_ROLES:
        return value
    raise rule_error("role", value, "does not run vLLM", "use encoder, prefill, decode or pd")


VllmRole = Annotated[Role, BeforeValidator(_vllm_role)]
"""A role that runs a vLLM server, given by its name ("encoder") or as the member."""
