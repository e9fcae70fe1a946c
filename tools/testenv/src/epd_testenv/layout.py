"""Where things live: the repository, the pinned binaries, the run state, and the versions they are pinned to.

One module so every entry point (the CLI, the demo, the pytest fixtures) agrees on the paths, and so the
versions tests expect come from the same go.mod files the build script builds from, never a second copy.
"""

from __future__ import annotations

import fcntl
import os
import pathlib
from dataclasses import dataclass
from typing import IO

BIN_DIR_ENV = "EPD_K8S_BIN_DIR"
"""Overrides where the pinned binaries are looked for (default: `<repo>/.cache/bin`)."""

DEFAULT_CLUSTER_DIR = pathlib.Path(".run/cluster")
"""State of the developer cluster (`make cluster-up`, `make demo`), relative to the repository."""

TEST_CLUSTER_DIR = pathlib.Path(".run/test-cluster")
"""State of the cluster the test session starts, so a test run and a demo cluster can coexist."""


SESSION_LOCK = ".session.lock"
MAX_PARALLEL_SESSIONS = 8


def claim_state_dir(base: pathlib.Path) -> tuple[pathlib.Path, IO[str]]:
    """A state folder no other live session holds: `base`, else `base-2`, `base-3`, ...

    Several people (or CI jobs) share one working tree here, and `up` restarts whatever cluster its folder
    holds, so each test session claims a folder with a lock held for its whole life. The lock goes with the
    process, so a crashed session never blocks the next. Keep the returned handle open while the cluster runs.
    """
    for n in range(1, MAX_PARALLEL_SESSIONS + 1):
        candidate = base if n == 1 else base.with_name(f"{base.name}-{n}")
        candidate.mkdir(parents=True, exist_ok=True)
        handle = (candidate / SESSION_LOCK).open("w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        return candidate, handle
    raise RuntimeError(f"{MAX_PARALLEL_SESSIONS} test sessions already hold {base} and its siblings")


def repo_root() -> pathlib.Path:
    """The repository: the nearest parent of the working directory holding tools/k8s, else this file's."""
    for start in (pathlib.Path.cwd(), pathlib.Path(__file__).resolve()):
        for candidate in (start, *start.parents):
            if (candidate / "tools" / "k8s").is_dir() and (candidate / "Makefile").is_file():
                return candidate
    raise RuntimeError("cannot find the epd-operator repository (a folder with Makefile and tools/k8s)")


def bin_dir() -> pathlib.Path:
    """The folder `hack/build-k8s-tools.sh` builds into."""
    override = os.environ.get(BIN_DIR_ENV)
    return pathlib.Path(override) if override else repo_root() / ".cache" / "bin"


def image_rows() -> list[list[str]]:
    """images/images.txt: [folder, tag] or [folder, tag, CPU flavour's tag, gpu-0.34 flavour's tag] per image, in build
    order."""
    lines = (repo_root() / "images" / "images.txt").read_text().splitlines()
    return [line.split() for line in lines if line.strip() and not line.startswith("#")]


def real_node_images() -> tuple[str, ...]:
    """What the real node runs: the operator, proxy and Mooncake images, and the CPU flavour of vLLM."""
    rows = {row[0]: row for row in image_rows()}
    return (rows["operator"][1], rows["proxy"][1], rows["mooncake"][1], rows["vllm"][2])


def helm_env(kubeconfig: pathlib.Path, home: pathlib.Path) -> dict[str, str]:
    """The environment for the pinned helm against one cluster, its cache and config under `home` (never ~)."""
    return {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def containerd_root() -> pathlib.Path:
    """The real node's containerd root (images and snapshots), a cache kept across clusters like the binaries."""
    return repo_root() / ".cache" / "containerd"


def binary(name: str) -> pathlib.Path:
    """The path of one pinned binary; fails with the command that builds it when it is missing."""
    path = bin_dir() / name
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"{path} is missing: run `make setup-k8s-tools` (builds the pinned binaries)")
    return path


@dataclass(frozen=True)
class PinnedVersions:
    """The versions tools/k8s/*/go.mod pin, as the binaries report them."""

    kubernetes: str
    """kube-apiserver, kube-controller-manager, kube-scheduler and kubectl, e.g. v1.36.3."""
    etcd: str
    """The etcd server embedded in the same binary, e.g. v3.6.8."""
    kwok: str
    """The node and pod simulator, e.g. v0.8.0."""
    helm: str
    """The helm client, e.g. v4.2.4."""
    coredns: str
    """The real node's cluster DNS, e.g. v1.15.0."""


def _required(go_mod: pathlib.Path, module: str) -> str:
    for line in go_mod.read_text().splitlines():
        fields = line.split()
        if fields[:1] == ["require"]:  # the one-line form: require MODULE VERSION
            fields = fields[1:]
        if len(fields) >= 2 and fields[0] == module:
            return fields[1]
    raise ValueError(f"{go_mod} does not require {module}")


def pinned_versions() -> PinnedVersions:
    """Read the pins from the tools modules (the single source of truth for them)."""
    tools = repo_root() / "tools" / "k8s"
    return PinnedVersions(
        kubernetes=_required(tools / "kube" / "go.mod", "k8s.io/kubernetes"),
        etcd=_required(tools / "kube" / "go.mod", "go.etcd.io/etcd/server/v3"),
        kwok=_required(tools / "kwok" / "go.mod", "sigs.k8s.io/kwok"),
        helm=_required(tools / "helm" / "go.mod", "helm.sh/helm/v4"),
        coredns=_required(tools / "coredns" / "go.mod", "github.com/coredns/coredns"),
    )
