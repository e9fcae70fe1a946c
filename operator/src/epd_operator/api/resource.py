"""An EPDDeployment as the lower layers see it: who owns the children, and the typed spec.

Render and derive never touch a raw API body; the handler turns the body into this once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from epd_connectors.config.base import ConfigError
from epd_connectors.config.vllm import DEFAULT_VLLM_VERSION, VllmVersion
from epd_operator.api import constants as c
from epd_operator.api.spec import EPDDeploymentSpec


@dataclass(frozen=True)
class Owner:
    """Identity of the EPDDeployment: names every child and becomes its ownerReference."""

    name: str
    namespace: str
    uid: str
    generation: int = 1

    def owner_reference(self) -> dict[str, Any]:
        """The ownerReference every child carries, so deleting the resource deletes them (garbage collection)."""
        return {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


@dataclass(frozen=True)
class OperatorPeer:
    """The operator's own pods in the cluster."""

    namespace: str
    labels: tuple[tuple[str, str], ...]
    """Labels every operator pod has (the chart's selector labels)."""


@dataclass(frozen=True)
class OperatorDefaults:
    """What the operator fills in where a spec is silent (set from Helm values / command-line flags)."""

    vllm_image: str = "epd/vllm:0.33.0"
    """Image of encoder, prefill and decode pods (vLLM 0.33.0 + CUDA Mooncake + epd-connectors)."""
    proxy_image: str = "epd/proxy:0.1.0"
    """Image of the proxy pods."""
    mooncake_image: str = "epd/mooncake:0.3.13"
    """Image of the Mooncake master and store-client pods."""
    gpu_resource: str = c.GPU_RESOURCE
    """Extended resource name of a GPU."""
    vllm_version: VllmVersion = DEFAULT_VLLM_VERSION
    """The vLLM of `vllm_image`, for specs that do not say (spec.images.vllmVersion)."""
    prometheus_url: str | None = None
    """The Prometheus that KEDA's triggers query for autoscaled roles (engine keda); None: none known, and such a
    role is refused with the fix."""
    operator_peer: OperatorPeer | None = None
    """Where the operator runs: a store master's NetworkPolicy admits it to the metrics port, where the operator
    reads the store's health. None outside a cluster (nothing to admit)."""


class InvalidSpecError(ConfigError):
    """The spec cannot be deployed; ``problems`` holds one message per problem (field, value, fix)."""


def parse_spec(spec: dict[str, Any]) -> EPDDeploymentSpec:
    """The typed spec, or InvalidSpecError naming each field (paths prefixed with `spec.`)."""
    try:
        return EPDDeploymentSpec.model_validate(spec)
    except ValidationError as exc:
        problems: list[str] = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            if msg.startswith("spec."):
                problems.extend(msg.split("; "))  # cross-field rules already name their fields
            elif msg.startswith("."):  # rules of a model used in several places name fields relative to it
                where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
                problems.extend(f"spec{where}{m}" for m in msg.split("; "))
            else:
                problems.append(f"spec.{loc} = {err.get('input')!r}: {msg}" if loc else msg)
        raise InvalidSpecError(problems) from exc
