"""An example EPDDeployment made to run on the real node: a pure function from the example to the manifest applied.

Every change is a spec field a user could write, so the operator renders the pods exactly as it would for them:
the local CPU profile (epd_local.profile, the values measured with the CPU build of vLLM), the CPU
flavour of the vLLM image, the tiny model and the shared folder as hostPaths on this machine, every component
placed on the real node by a nodeSelector (the simulated nodes beside it would otherwise take some), and CPU
requests small enough for a 2-core node.
"""

from __future__ import annotations

import dataclasses
import pathlib
from dataclasses import dataclass
from typing import Any

import yaml

from epd_local import plan, profile
from epd_operator.api import constants as c
from epd_operator.api.resource import Owner
from epd_operator.api.spec import EPDDeploymentSpec
from epd_testenv import nodes, realnode


def _small_requests() -> dict[str, Any]:
    """For the master and the proxy (1 CPU each by default: with the operator that is more than 2 cores)."""
    return {"requests": {"cpu": "100m", "memory": "256Mi"}}


@dataclass(frozen=True)
class RealNodeSite:
    """What the manifest needs from this machine."""

    vllm_image: str
    """The CPU flavour's tag (images.txt, third column)."""
    model_dir: pathlib.Path
    """The tiny model's folder (world-readable: the pods run as user 10001)."""
    shared_dir: pathlib.Path | None = None
    """A folder owned by the pods' user, for the shared-storage (ECExample) connector."""


def manifest(
    example: pathlib.Path,
    site: RealNodeSite,
    *,
    max_surge: int = 0,
    name: str | None = None,
    namespace: str | None = None,
    transfer_check: dict[str, Any] | None = None,
    master_ha: dict[str, Any] | None = None,
) -> tuple[Owner, dict[str, Any]]:
    """The example's owner and the EPDDeployment to apply; `max_surge` for the model roles' rollouts (the node
    has GPUs to spare); `name` and `namespace` replace the example's; `transfer_check` is spec.proxy's and
    `master_ha` spec.store.master's."""
    owner, spec = plan.load_manifest(example)
    owner = dataclasses.replace(owner, name=name or owner.name, namespace=namespace or owner.namespace)
    spec, _ = profile.apply_profile(spec, profile.CPU)
    body = spec_for_real_node(spec, site, max_surge=max_surge)
    if transfer_check is not None:
        body["proxy"]["transferCheck"] = transfer_check
    if master_ha is not None:
        body["store"].setdefault("master", {})["ha"] = master_ha
    return owner, {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND,
        "metadata": {"name": owner.name, "namespace": owner.namespace},
        "spec": body,
    }


def spec_for_real_node(spec: EPDDeploymentSpec, site: RealNodeSite, *, max_surge: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = spec.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    body.setdefault("images", {})["vllm"] = site.vllm_image
    body["model"]["source"] = {"hostPath": {"path": str(site.model_dir)}}
    if "sharedStorage" in body:
        if site.shared_dir is None:
            raise ValueError("the example uses spec.sharedStorage: give RealNodeSite.shared_dir")
        body["sharedStorage"] = {"hostPath": {"path": str(site.shared_dir)}}
    nodes.place_on(body, {realnode.REAL_NODE_LABEL: "true"})
    for role in ("encoder", "prefill", "decode"):
        if role in body and max_surge:
            body[role]["maxSurge"] = max_surge
    body["proxy"]["resources"] = _small_requests()
    if spec.store is not None:
        body["store"]["master"]["resources"] = _small_requests()
    return body


def dump(document: dict[str, Any]) -> str:
    return yaml.safe_dump(document, sort_keys=False)
