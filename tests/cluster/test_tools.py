"""The pinned command-line tools run, report the versions tools/k8s pins, and reach the test cluster.

Versions are read from the tools modules' go.mod files, the same source the build uses, so a version bump
that forgets to rebuild (or a build that forgets to stamp its version) fails here.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

from epd_testenv import cluster, layout, process

pytestmark = pytest.mark.cluster


def run(*argv: str | pathlib.Path, kubeconfig: pathlib.Path | None = None) -> str:
    env = dict(os.environ)
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, f"{argv}: {done.stderr}"
    return done.stdout


def test_kubectl_reports_the_pinned_client_and_server_version(kubectl: pathlib.Path, kubeconfig: pathlib.Path) -> None:
    pinned = layout.pinned_versions().kubernetes
    versions = json.loads(run(kubectl, "version", "-o", "json", kubeconfig=kubeconfig))
    assert versions["clientVersion"]["gitVersion"] == pinned
    assert versions["serverVersion"]["gitVersion"] == pinned


def test_kubectl_lists_the_simulated_nodes(kubectl: pathlib.Path, kubeconfig: pathlib.Path) -> None:
    out = run(kubectl, "get", "nodes", "-l", "epd.testenv/simulated=true", "-o", "name", kubeconfig=kubeconfig)
    assert len(out.split()) >= 4


def test_helm_reports_the_pinned_version_and_reaches_the_cluster(helm: pathlib.Path, kubeconfig: pathlib.Path) -> None:
    assert run(helm, "version", "--short").strip().startswith(layout.pinned_versions().helm)
    # An empty release list proves helm authenticates against the test apiserver.
    assert json.loads(run(helm, "list", "--all-namespaces", "-o", "json", kubeconfig=kubeconfig)) == []


def test_etcd_and_kwok_report_the_pinned_versions() -> None:
    pinned = layout.pinned_versions()
    assert f"etcd Version: {pinned.etcd.removeprefix('v')}" in run(layout.binary("etcd"), "--version")
    assert pinned.kwok.removeprefix("v") in run(layout.binary("kwok"), "--version")


def test_the_real_nodes_binaries_report_the_pinned_versions() -> None:
    """kubelet and kube-proxy live in the same multi-call binary as the servers; CoreDNS is its own module."""
    pinned = layout.pinned_versions()
    for name in ("kubelet", "kube-proxy"):
        assert run(layout.binary(name), "--version").strip() == f"Kubernetes {pinned.kubernetes}"
    assert f"CoreDNS-{pinned.coredns.removeprefix('v')}" in run(layout.binary("coredns"), "-version")


def _listening(pid: int) -> set[str]:
    """The local addresses a process listens on (TCP over IPv4 and IPv6), read from /proc."""
    inodes = set()
    for fd in pathlib.Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    addresses = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in pathlib.Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            listen_state = "0A"
            if fields[3] == listen_state and fields[9] in inodes:
                addresses.add(fields[1])
    return addresses


def test_every_component_listens_on_loopback_only(test_cluster: cluster.Cluster) -> None:
    loopback_v4 = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it (little-endian hex)
    recorded, _ = process.load(test_cluster.state_dir)
    assert {p.name for p in recorded} >= {"etcd", "kube-apiserver", "kube-controller-manager", "kwok"}
    for p in recorded:
        for address in _listening(p.pid):
            assert address.split(":")[0] == loopback_v4, f"{p.name} listens on {address}"
