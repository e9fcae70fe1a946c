"""A rendered pod template run as one podman container on this machine, as a kubelet would run it.

No kubelet runs here yet, so the pod spec render produces meets the images through this translation: the
container's command and env, its security context (user and group 10001, read-only root filesystem, every
capability dropped, no privilege escalation) and every volume, each made the way a kubelet makes it: a
ConfigMap as a read-only folder of its keys, an emptyDir as a fresh folder of the pod's fsGroup (a memory one as
tmpfs), a hostPath as that path unless the test maps the volume elsewhere. The network is the host's: the
bundles come from a loopback site (derive.site.LocalNetwork), so every address in them is 127.0.0.1, the pod IP
included. What is not translated (a PVC, a projected volume) is refused, never skipped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epd_operator.render.pod import RUN_AS_USER

LOOPBACK = "127.0.0.1"
ULIMITS = ("nofile=16384:16384", "nproc=16384:16384")
"""Below this machine's hard limits (podman's defaults are above them, and the sandbox lacks CAP_SYS_RESOURCE)."""


def locked_down(network: str) -> list[str]:
    """`podman run` options for a container as the pods run them, when no pod template says more: user and group
    10001, read-only root (no tmpfs of podman's own), every capability dropped, no privilege escalation."""
    options = ["--network", network, "--user", f"{RUN_AS_USER}:{RUN_AS_USER}", "--read-only", "--read-only-tmpfs=false"]
    options += ["--cap-drop=ALL", "--security-opt", "no-new-privileges"]
    return options + [arg for limit in ULIMITS for arg in ("--ulimit", limit)]


class UntranslatableError(ValueError):
    """A part of the pod template this runner cannot make; the message names it."""


@dataclass(frozen=True)
class Volumes:
    """Where each volume of the pod lives on the host, made by `prepare`."""

    binds: list[tuple[str, str, bool]] = field(default_factory=list)
    """(host path, mount path, read-only)."""
    tmpfs: list[str] = field(default_factory=list)
    """Mount paths of memory-backed emptyDirs."""


def container_of(template: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = template["spec"]["containers"]
    if len(containers) != 1:
        raise UntranslatableError(f"{len(containers)} containers: this runner runs pods of one container")
    container: Mapping[str, Any] = containers[0]
    return container


def prepare(
    template: Mapping[str, Any],
    configmaps: Mapping[str, Mapping[str, Any]],
    root: Path,
    host_paths: Mapping[str, Path] | None = None,
) -> Volumes:
    """Make every mounted volume under `root` (or take it from `host_paths`, by volume name): the side effects
    a kubelet has before it starts the container."""
    spec = template["spec"]
    group = int(spec.get("securityContext", {}).get("fsGroup", os.getgid()))
    user = int(spec.get("securityContext", {}).get("runAsUser", os.getuid()))
    by_name = {v["name"]: v for v in spec.get("volumes", [])}
    volumes = Volumes()
    for mount in container_of(template).get("volumeMounts", []):
        volume = by_name[mount["name"]]
        read_only = bool(mount.get("readOnly", False))
        target = mount["mountPath"]
        if host_paths and mount["name"] in host_paths:
            volumes.binds.append((str(host_paths[mount["name"]]), target, read_only))
        elif "configMap" in volume:
            folder = root / mount["name"]
            folder.mkdir(parents=True, exist_ok=True)
            data = configmaps[volume["configMap"]["name"]]["data"]
            for key, text in data.items():
                (folder / key).write_text(text, encoding="utf-8")
            volumes.binds.append((str(folder), target, True))
        elif "emptyDir" in volume:
            if volume["emptyDir"].get("medium") == "Memory":
                volumes.tmpfs.append(target)
                continue
            folder = root / mount["name"]
            folder.mkdir(parents=True, exist_ok=True)
            os.chown(folder, user, group)
            folder.chmod(0o2775)
            volumes.binds.append((str(folder), target, read_only))
        elif "hostPath" in volume:
            volumes.binds.append((volume["hostPath"]["path"], target, read_only))
        else:
            raise UntranslatableError(f"volume {mount['name']}: {sorted(set(volume) - {'name'})} is not translated")
    return volumes


def _env(container: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for entry in container.get("env", []):
        if "value" in entry:
            out.append(f"{entry['name']}={entry['value']}")
        elif entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            out.append(f"{entry['name']}={LOOPBACK}")  # the host network's address
        else:
            raise UntranslatableError(f"env {entry['name']}: {entry.get('valueFrom')} is not translated")
    return out


def podman_argv(template: Mapping[str, Any], image: str, name: str, volumes: Volumes) -> list[str]:
    """`podman run` for the template's one container (pure): detached, on the host network."""
    container = container_of(template)
    pod_context = template["spec"].get("securityContext", {})
    context = {**pod_context, **container.get("securityContext", {})}
    argv = ["podman", "run", "--detach", "--name", name, "--network", "host", "--pull", "never"]
    argv += [arg for limit in ULIMITS for arg in ("--ulimit", limit)]
    if "runAsUser" in context:
        argv += ["--user", f"{context['runAsUser']}:{context.get('runAsGroup', context['runAsUser'])}"]
    if "fsGroup" in pod_context:
        argv += ["--group-add", str(pod_context["fsGroup"])]
    if context.get("readOnlyRootFilesystem"):
        argv += ["--read-only", "--read-only-tmpfs=false"]  # a pod gets no tmpfs of its own
    dropped = context.get("capabilities", {}).get("drop", [])
    argv += [f"--cap-drop={cap}" for cap in dropped]
    if context.get("allowPrivilegeEscalation") is False:
        argv += ["--security-opt", "no-new-privileges"]
    for value in _env(container):
        argv += ["--env", value]
    for host, target, read_only in volumes.binds:
        argv += ["--volume", f"{host}:{target}:{'ro' if read_only else 'rw'}"]
    for target in volumes.tmpfs:
        argv += ["--tmpfs", target]
    command = list(container.get("command", [])) + list(container.get("args", []))
    if command:
        argv += ["--entrypoint", json.dumps(command)]
    argv.append(image)
    return argv


def readiness_url(template: Mapping[str, Any]) -> str | None:
    """The readiness probe's HTTP URL on loopback (a named port resolved), or None (a TCP or no probe)."""
    container = container_of(template)
    probe = container.get("readinessProbe") or {}
    get = probe.get("httpGet")
    if get is None:
        return None
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    port = ports.get(get["port"], get["port"])
    return f"http://{LOOPBACK}:{port}{get.get('path', '/')}"
