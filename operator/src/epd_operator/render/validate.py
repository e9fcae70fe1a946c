"""Turning the connector library's rule messages into problems that name the spec field to change.

The connector models name their own fields (vllm.extra_args, mooncake.tenant_id); a user edits the
EPDDeployment, so each message is prefixed with the spec path of the role it came from, and the
deployment-wide disagreements are mapped to the spec field that decides the value.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TypeVar

from pydantic import ValidationError

from epd_connectors.config.base import ConfigError, describe_validation_error
from epd_connectors.config.bundle import RoleBundle
from epd_connectors.config.consistency import (
    RULE_P2P_TP,
    RULE_PROXY_ROSTER,
    RULE_QUOTA_ADMISSION,
    RULE_STORE_OWNER,
    check_deployment,
)
from epd_operator.api.resource import InvalidSpecError

T = TypeVar("T")

# A connector field the user sets directly, and the spec field (relative to the role) that feeds it.
_USER_FIELDS = (("extra_args", "extraArgs"), ("env", "env"))

# Each check_deployment rule and the spec field that decides it (a unit test keeps it complete).
RULE_FIELDS = {
    "tenant id": "spec.store.tenant.id",
    "transfer protocol": "spec.store.protocol",
    "KV cache prefix": "spec.store.kvCachePrefix",
    "store TP": "spec.prefill.tensorParallelSize / spec.prefill.additionalPools[].tensorParallelSize",
    "embedding cache prefix": "spec.encoder.crossEncoderCache.prefix",
    "PYTHONHASHSEED": "spec.<role>.env",
    "offload": "spec.store.clients.offload.enabled",
    "store endpoints": "spec.store.master",
    "store mode": "spec.store.mode",
    RULE_QUOTA_ADMISSION: "spec.store.tenant.id",
    RULE_STORE_OWNER: "spec.store.mode",
    RULE_PROXY_ROSTER: "spec.proxy",
    RULE_P2P_TP: "spec.prefill.tensorParallelSize / spec.prefill.additionalPools[].tensorParallelSize / "
    "spec.decode.tensorParallelSize",
}


def locate(spec_path: str, line: str) -> str:
    """`line` (a connector rule message) prefixed with the spec field it comes from."""
    # The first words name the connector field ("vllm.extra_args: extra_args = ...", "env.X = ...").
    words = set(re.split(r"[.\s=:]+", line.split(" = ", 1)[0]))
    for connector_field, spec_field in _USER_FIELDS:
        if connector_field in words:
            return f"{spec_path}.{spec_field}: {line}"
    return f"{spec_path}: {line}"


def guarded(spec_path: str, build: Callable[[], T]) -> T:
    """Run a builder of connector models; their validation errors become an InvalidSpecError at spec_path."""
    try:
        return build()
    except ValidationError as exc:
        raise InvalidSpecError([locate(spec_path, line) for line in describe_validation_error(exc)]) from exc
    except InvalidSpecError:
        raise  # already names the spec field
    except ConfigError as exc:
        raise InvalidSpecError([locate(spec_path, line) for line in exc.problems]) from exc


def collect(builds: list[tuple[str, Callable[[], T]]]) -> tuple[dict[str, T], list[str]]:
    """Run every builder, keeping the results by key and every problem (a user sees all of them at once)."""
    results: dict[str, T] = {}
    problems: list[str] = []
    for key, build in builds:
        try:
            results[key] = build()
        except InvalidSpecError as exc:
            problems.extend(exc.problems)
    return results, problems


def deployment_problems(bundles: Mapping[str, RoleBundle]) -> list[str]:
    """check_deployment over every bundle, each disagreement prefixed with the spec field deciding it."""
    return [f"{RULE_FIELDS.get(d.rule, 'spec')}: {d.message}" for d in check_deployment(bundles)]
