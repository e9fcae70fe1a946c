"""The images tier: every image `make images-test` built (images/build.sh, buildah here), run as podman containers
from the pod templates render produces, with the pods' security context (tests/images/pods.py).

Each test renders an example on a loopback site with the pods' own paths (LocalNetwork + Paths()), so the
bundles it mounts are the ones a pod would get except for addresses, and runs the role's workload as a
container on the host network. A container that does not become ready fails the test with its log.
"""

from __future__ import annotations

import contextlib
import random
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from epd_local import plan as local_plan
from epd_local import profile
from epd_operator.api.resource import OperatorDefaults
from epd_operator.derive.site import LocalNetwork, Paths, Site
from epd_operator.render import render_desired
from tests.images import pods

REPO = Path(__file__).resolve().parents[2]
BUILD_HINT = "run `make images-test` (builds the images the tests run with buildah, installed by the build)"
READY_DEADLINE_S = 120.0


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check, timeout=timeout)


def require_image(tag: str) -> str:
    """The tag, once podman has it; a failure naming the build step otherwise."""
    try:
        found = podman("image", "exists", tag, check=False).returncode == 0
    except FileNotFoundError:
        found = False
    if not found:
        pytest.fail(f"image {tag} is not built here: {BUILD_HINT}", pytrace=False)
    return tag


@dataclass(frozen=True)
class Rendered:
    """An example rendered for containers on this machine: its objects by kind and name."""

    objects: dict[tuple[str, str], dict[str, Any]]

    def template(self, workload: str) -> dict[str, Any]:
        for kind in ("Deployment", "StatefulSet", "DaemonSet"):
            if (kind, workload) in self.objects:
                template: dict[str, Any] = self.objects[(kind, workload)]["spec"]["template"]
                return template
        raise KeyError(f"no workload {workload}; objects: {sorted(self.objects)}")

    @property
    def configmaps(self) -> dict[str, Mapping[str, Any]]:
        return {name: obj for (kind, name), obj in self.objects.items() if kind == "ConfigMap"}


def render_for_containers(example: Path) -> Rendered:
    """The example with the local CPU profile, rendered on loopback ports that are free now, with pod paths."""
    owner, spec = local_plan.load_manifest(example)
    spec, _ = profile.apply_profile(spec, profile.CPU)
    network = LocalNetwork(base_port=random.randrange(33000, 60000))
    desired = render_desired(owner, spec, OperatorDefaults(), Site(network=network, paths=Paths()))
    return Rendered({(o["kind"], o["metadata"]["name"]): o for o in desired.objects})


@dataclass
class Container:
    name: str
    ready_url: str | None

    def logs(self, limit: int | None = 6000) -> str:
        """Its output (the end, `limit` characters; None: all)."""
        result = podman("logs", self.name, check=False)
        text = result.stdout + result.stderr
        return text if limit is None else text[-limit:]

    def running(self) -> bool:
        state = podman("inspect", "--format", "{{.State.Running}}", self.name, check=False)
        return state.stdout.strip() == "true"

    def exec(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.name, *argv, check=False)

    def wait_ready(self, deadline_s: float = READY_DEADLINE_S, ok: tuple[int, ...] = (200,)) -> int:
        """Until its readiness URL answers one of `ok` (the status is returned); fails with the log if it exits
        or the deadline passes."""
        assert self.ready_url is not None, f"{self.name} has no HTTP readiness probe"
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            status = http_status(self.ready_url)
            if status in ok:
                return status
            if not self.running():
                pytest.fail(f"container {self.name} exited before it was ready:\n{self.logs()}", pytrace=False)
            time.sleep(0.5)
        pytest.fail(f"container {self.name}: {self.ready_url} not ready in {deadline_s:.0f}s:\n{self.logs()}")


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return None


@contextlib.contextmanager
def pod(
    rendered: Rendered,
    workload: str,
    image: str,
    root: Path,
    host_paths: Mapping[str, Path] | None = None,
) -> Iterator[Container]:
    """The workload's pod template run as a container of `image`; removed on the way out."""
    template = rendered.template(workload)
    volumes = pods.prepare(template, rendered.configmaps, root / workload, host_paths)
    name = f"epd-test-{workload}-{random.randrange(1 << 30):x}"
    started = podman(*pods.podman_argv(template, require_image(image), name, volumes)[1:], check=False)
    if started.returncode != 0:
        pytest.fail(f"podman run {workload} failed: {started.stderr}", pytrace=False)
    container = Container(name, pods.readiness_url(template))
    try:
        yield container
    finally:
        podman("rm", "--force", "--time", "10", name, check=False, timeout=60)
