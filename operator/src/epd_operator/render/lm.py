"""The vLLM roles' objects: a Deployment and a headless Service each for encoders, every prefill pool, and
decode (or combined PD).

GPUs come from the tensor parallel size, so a user sets TP once and the scheduler, vLLM and the store TP all
follow from it.
"""

from __future__ import annotations

from typing import Any, Final

from epd_connectors.config.roles import Role
from epd_operator.api import constants as c
from epd_operator.api.model import ModelSource
from epd_operator.api.resource import InvalidSpecError
from epd_operator.derive import ports
from epd_operator.render import objects, transfer
from epd_operator.render.bundles_vllm import role_spec
from epd_operator.render.context import SHARED_DIR, Context, Unit
from epd_operator.render.pod import PodParams, Probes, http_get, pod_template

MODEL_LOAD_STARTUP_FAILURES: Final = 180
"""Startup probe failures (10 s apart): 30 minutes for epd-launch's store wait (up to 10) and loading weights."""
SHM_SIZE: Final = "2Gi"
"""/dev/shm for torch's inter-process tensors (TP workers, the multimodal processor); the runtime's 64 MiB
default breaks them."""


def container_ports(ctx: Context, unit: Unit) -> dict[str, int]:
    """HTTP, plus the EC control ports on EC consumers and the bootstrap port on MooncakeConnector prefills."""
    ec_consumer = unit.role in (Role.PREFILL, Role.PD) and ctx.spec.encoder.pushes_embeddings
    bootstrap = transfer.runs_bootstrap_server(ctx, unit.role)
    return ports.vllm_ports(
        tensor_parallel_size=unit.tensor_parallel_size, ec_consumer=ec_consumer, kv_bootstrap=bootstrap
    )


def _gpu_resources(ctx: Context, unit: Unit) -> dict[str, Any]:
    res = role_spec(ctx, unit).resources
    gpu = ctx.defaults.gpu_resource
    for kind, given in (("requests", res.requests), ("limits", res.limits)):
        if gpu in given and str(given[gpu]) != str(unit.tensor_parallel_size):
            raise InvalidSpecError(
                [
                    f"{unit.spec_path}.resources.{kind}[{gpu}] = {given[gpu]!r}: the operator sets one GPU per "
                    f"tensor parallel rank ({unit.tensor_parallel_size} for {unit.name}). Fix: remove it and set "
                    "tensorParallelSize"
                ]
            )
    out: dict[str, Any] = {"limits": {**res.limits, gpu: unit.tensor_parallel_size}}
    if res.requests:
        out["requests"] = {**res.requests, gpu: unit.tensor_parallel_size}
    return out


def _model_volume(source: ModelSource) -> dict[str, Any]:
    if source.pvc is not None:
        return {"name": "model", "persistentVolumeClaim": {"claimName": source.pvc.claim_name, "readOnly": True}}
    if source.host_path is not None:
        return {"name": "model", "hostPath": {"path": source.host_path.path, "type": "Directory"}}
    assert source.image is not None  # the API model guarantees exactly one source
    return {"name": "model", "image": {"reference": source.image.reference, "pullPolicy": source.image.pull_policy}}


def _volumes(ctx: Context, unit: Unit) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes = [
        _model_volume(ctx.spec.model.source),
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "model", "mountPath": c.MODEL_MOUNT_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    shared = ctx.spec.shared_storage
    if shared is not None and transfer.uses_shared_storage(ctx, unit.role):
        source: dict[str, Any] = (
            {"persistentVolumeClaim": {"claimName": shared.pvc.claim_name}}
            if shared.pvc is not None
            else {"hostPath": {"path": shared.host_path.path if shared.host_path else "", "type": "DirectoryOrCreate"}}
        )
        volumes.append({"name": "shared", **source})
        mounts.append({"name": "shared", "mountPath": SHARED_DIR})
    return volumes, mounts


def render_vllm_deployment(ctx: Context, unit: Unit, bundle_json: str) -> dict[str, Any]:
    """The Deployment of an encoder, prefill pool, decode or PD unit (render_encoder_deployment & co.)."""
    volumes, mounts = _volumes(ctx, unit)
    probes = Probes(
        readiness=http_get("/health", ports.HTTP, period_s=5, failures=3),
        liveness=http_get("/health", ports.HTTP, period_s=10, failures=6),
        startup=http_get("/health", ports.HTTP, period_s=10, failures=MODEL_LOAD_STARTUP_FAILURES),
    )
    params = PodParams(
        unit=unit,
        image=ctx.spec.images.vllm or ctx.defaults.vllm_image,
        bundle_json=bundle_json,
        ports=container_ports(ctx, unit),
        probes=probes,
        resources=_gpu_resources(ctx, unit),
        node_selector=role_spec(ctx, unit).node_selector,
        volumes=volumes,
        mounts=mounts,
    )
    return objects.render_deployment(ctx, unit, pod_template(ctx, params), max_surge=role_spec(ctx, unit).max_surge)


def render_vllm_service(ctx: Context, unit: Unit) -> dict[str, Any]:
    """Headless: the proxy resolves it to the ready pods, and reaches each pod's EC/bootstrap ports."""
    return objects.render_service(ctx, unit, container_ports(ctx, unit), headless=True)
