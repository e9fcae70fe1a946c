"""The pod template every role shares: hardened security context, the work and bundle volumes, POD_IP, the
epd-launch command, probes and resources.

Every pod runs the same entrypoint (`epd-launch <role> --bundle /etc/epd/bundle.json`), so the pod template
differs between roles only in image, ports, probes, resources and extra volumes, which `PodParams` carries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from epd_connectors.config.bundle import POD_IP_ENV, WORKDIR_ENV
from epd_connectors.config.roles import VLLM_ROLES
from epd_operator.api import constants as c
from epd_operator.render import meta
from epd_operator.render.context import Context, Unit

RUN_AS_USER: Final = 10001
"""The images' non-root user and group; fixed so file ownership on shared volumes is predictable."""
BUNDLE_PATH: Final = f"{c.BUNDLE_MOUNT_DIR}/{c.BUNDLE_FILE}"
WORK_VOLUME: Final = "work"
BUNDLE_VOLUME: Final = "bundle"
TMP_VOLUME: Final = "tmp"


@dataclass(frozen=True)
class Probes:
    """The container's probes; startup covers epd-launch's wait for the store and the model load."""

    readiness: dict[str, Any]
    liveness: dict[str, Any]
    startup: dict[str, Any] | None = None


@dataclass(frozen=True)
class PodParams:
    """What differs between roles' pod templates."""

    unit: Unit
    image: str
    bundle_json: str
    ports: dict[str, int]
    probes: Probes
    resources: dict[str, Any]
    node_selector: dict[str, str] = field(default_factory=dict)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)


def http_get(path: str, port: str, *, period_s: int, failures: int) -> dict[str, Any]:
    """An HTTP probe on a named container port."""
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period_s, "failureThreshold": failures}


def tcp_socket(port: str, *, period_s: int, failures: int) -> dict[str, Any]:
    """A TCP probe on a named container port (for processes without an HTTP health endpoint)."""
    return {"tcpSocket": {"port": port}, "periodSeconds": period_s, "failureThreshold": failures}


def _security_context() -> dict[str, Any]:
    # The launcher writes only to the work volume, so the root filesystem can be read-only, and nothing in
    # these processes needs a capability (RDMA memory registration works through the device plugin).
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "capabilities": {"drop": ["ALL"]},
    }


def _env() -> list[dict[str, Any]]:
    return [
        # The address every Mooncake process and vLLM advertises to peers; only the pod knows it.
        {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": WORKDIR_ENV, "value": c.WORK_DIR},
        # vLLM, torch and HF write caches under $HOME; the root filesystem is read-only.
        {"name": "HOME", "value": c.WORK_DIR},
    ]


def pod_template(ctx: Context, params: PodParams) -> dict[str, Any]:
    """The complete pod template of a role's workload."""
    unit = params.unit
    bundle_cm = ctx.names.bundle_configmap(unit.name)
    container: dict[str, Any] = {
        "name": unit.role.value,
        "image": params.image,
        "command": ["epd-launch", unit.role.value, "--bundle", BUNDLE_PATH],
        "env": _env(),
        # The site's port for each (a cluster's fixed one), so the port the container declares and probes is
        # the one its bundle binds on every site.
        "ports": [
            {"name": n, "containerPort": ctx.port(unit.name, n, p), "protocol": "TCP"} for n, p in params.ports.items()
        ],
        "resources": params.resources,
        "readinessProbe": params.probes.readiness,
        "livenessProbe": params.probes.liveness,
        "securityContext": _security_context(),
        "volumeMounts": [
            {"name": BUNDLE_VOLUME, "mountPath": c.BUNDLE_MOUNT_DIR, "readOnly": True},
            {"name": WORK_VOLUME, "mountPath": c.WORK_DIR},
            {"name": TMP_VOLUME, "mountPath": "/tmp"},
            *params.mounts,
        ],
    }
    if params.probes.startup is not None:
        container["startupProbe"] = params.probes.startup
    spec: dict[str, Any] = {
        # Pods do not talk to the API server (the proxy, which follows EndpointSlices, opts in).
        "automountServiceAccountToken": False,
        # Service env vars (e.g. VLLM_* for a deployment named "vllm") could reach vLLM's own settings.
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": BUNDLE_VOLUME, "configMap": {"name": bundle_cm}},
            {"name": WORK_VOLUME, "emptyDir": {}},
            {"name": TMP_VOLUME, "emptyDir": {}},
            *params.volumes,
        ],
    }
    if params.node_selector:
        spec["nodeSelector"] = dict(params.node_selector)
    labels = meta.labels(ctx.owner, unit.role, unit.pool)
    if unit.role in VLLM_ROLES:
        # Not in the selector (immutable): a new model rolls the pods, and old and new pods stay one workload.
        labels[c.LABEL_MODEL_REVISION] = ctx.model_revision
        # Ready only once the revision has a whole set (revision_gate), so a roll switches sets at once.
        spec["readinessGates"] = [{"conditionType": c.CONDITION_REVISION_READY}]
        # Deleted (a roll, a scale-in), it serves on until the proxy has dropped it, then drains what is in flight.
        container["lifecycle"] = {"preStop": {"sleep": {"seconds": c.VLLM_DRAIN_DELAY_S}}}
        spec["terminationGracePeriodSeconds"] = c.VLLM_TERMINATION_GRACE_S
    return {
        "metadata": {
            "labels": labels,
            "annotations": {c.ANNOTATION_BUNDLE_HASH: meta.bundle_hash(params.bundle_json)},
        },
        "spec": spec,
    }
