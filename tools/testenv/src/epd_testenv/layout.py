"""Where things live: the repository, the pinned binaries, the run state, and the versions they are pinned to.

One module so every entry point (the CLI, the demo, the pytest fixtures) agrees on the paths, and so the
versions tests expect come from the same go.mod files the build script builds from, never a second copy.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass

BIN_DIR_ENV = "EPD_K8S_BIN_DIR"
"""Overrides where the pinned binaries are looked for (default: `<repo>/.cache/bin`)."""

DEFAULT_CLUSTER_DIR = pathlib.Path(".run/cluster")
"""State of the developer cluster (`make cluster-up`, `make demo`), relative to the repository."""

TEST_CLUSTER_DIR = pathlib.Path(".run/test-cluster")
"""State of the cluster the test session starts, so a test run and a demo cluster can coexist."""


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


def _required(go_mod: pathlib.Path, module: str) -> str:
    for line in go_mod.read_text().splitlines():
        fields = line.split()
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
    )
