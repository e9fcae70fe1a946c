"""The command lines and config files of the five control-plane processes, as pure functions.

Kept apart from starting processes so the flags can be read in one place and so every address in them is
visibly loopback: each server binds 127.0.0.1 on a port picked at start, and nothing else listens.
"""

from __future__ import annotations

import base64
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from epd_testenv import pki as pki_

LOOPBACK = "127.0.0.1"
CONTEXT = "epd-testenv"
"""The kubeconfig context (and cluster) name of every generated kubeconfig."""

STAGES_FILE = pathlib.Path(__file__).with_name("kwok-stages.yaml")
"""kwok's Stage objects (node-initialize, node-heartbeat-with-lease, pod-ready, pod-complete, pod-delete)."""

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_ANNOTATION_VALUE = "fake"


@dataclass(frozen=True)
class Ports:
    """Loopback ports picked when the cluster starts, so several clusters can run side by side."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int


@dataclass(frozen=True)
class Network:
    """Address ranges handed out to simulated objects: loopback, so a stray connection stays on this machine.

    Nothing listens on these addresses and nothing may connect to them. One consequence: the apiserver refuses
    loopback addresses in EndpointSlices, so a Service selecting simulated pods gets no EndpointSlice (the
    controller-manager records FailedToUpdateEndpointSlices events). A test that needs EndpointSlices can use
    a pod range outside loopback that is never routed, such as 198.18.0.0/16 (RFC 2544 benchmarking).
    """

    pod_cidr: str = "127.64.0.0/16"
    """kwok's pod IPs (65k addresses: room for every pod the nodes can hold)."""
    service_cidr: str = "127.96.0.0/16"
    """ClusterIPs; the apiserver accepts a loopback range here."""
    api_host: str = LOOPBACK
    """Where the apiserver listens and what it advertises: loopback, or with a real node the host's address
    on the harness's bridge (pods reach the `kubernetes` Service there, realnode.NodeNetwork)."""

    @property
    def real_node(self) -> bool:
        return self.api_host != LOOPBACK


@dataclass(frozen=True)
class Component:
    """One process of the control plane."""

    name: str
    """Also the name of its log file and, except kwok, of the symlink into the multi-call binary."""
    argv: tuple[str, ...]
    """Arguments after the binary."""
    binary: str | None = None
    """A program of the machine (containerd), looked up on PATH; None: the pinned binary `name`."""


@dataclass(frozen=True)
class Files:
    """Where a cluster keeps its files (all under one state folder)."""

    state: pathlib.Path

    @property
    def pki(self) -> pki_.Pki:
        return pki_.Pki(self.state / "pki")

    @property
    def etcd_data(self) -> pathlib.Path:
        return self.state / "etcd"

    @property
    def logs(self) -> pathlib.Path:
        return self.state / "logs"

    @property
    def kubeconfig(self) -> pathlib.Path:
        """The admin kubeconfig handed to users and tests."""
        return self.state / "kubeconfig"

    def component_kubeconfig(self, name: str) -> pathlib.Path:
        return self.state / "config" / f"{name}.kubeconfig"

    @property
    def scheduler_config(self) -> pathlib.Path:
        return self.state / "config" / "kube-scheduler.yaml"


def server_url(ports: Ports, network: Network) -> str:
    return f"https://{network.api_host}:{ports.apiserver}"


def _b64(path: pathlib.Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def kubeconfig(server: str, pki: pki_.Pki, identity: str, context: str) -> dict[str, Any]:
    """A self-contained kubeconfig (certificates inlined) for one client identity."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": context,
                "cluster": {"server": server, "certificate-authority-data": _b64(pki.ca_cert)},
            }
        ],
        "users": [
            {
                "name": identity,
                "user": {
                    "client-certificate-data": _b64(pki.client_cert(identity)),
                    "client-key-data": _b64(pki.client_key(identity)),
                },
            }
        ],
        "contexts": [{"name": context, "context": {"cluster": context, "user": identity}}],
        "current-context": context,
    }


CLIENT_QPS = 300
"""Request rate of controller-manager and scheduler (defaults 20 and 50): with simulated pods that become Ready
at once, the default client throttling, not the operator, decided how fast 50 deployments came up (measured:
60-67 s with the defaults, about 41 s with these)."""
CLIENT_BURST = 600


def scheduler_config(files: Files) -> dict[str, Any]:
    """kube-scheduler takes its client and leader-election settings from a config file, not flags."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {
            "kubeconfig": str(files.component_kubeconfig("kube-scheduler")),
            "qps": CLIENT_QPS,
            "burst": CLIENT_BURST,
        },
        "leaderElection": {"leaderElect": False},
    }


def etcd(files: Files, ports: Ports) -> Component:
    client = f"http://{LOOPBACK}:{ports.etcd_client}"
    peer = f"http://{LOOPBACK}:{ports.etcd_peer}"
    return Component(
        "etcd",
        (
            "--name=epd",
            f"--data-dir={files.etcd_data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=epd={peer}",
            # Test data is disposable: skipping fsync makes every write several times faster.
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ),
    )


def apiserver(files: Files, ports: Ports, network: Network) -> Component:
    p = files.pki
    if network.real_node:
        node_flags: tuple[str, ...] = (
            # The kubelet's address, not its name through the machine's resolver (logs, exec, port-forward).
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={p.client_cert(pki_.KUBELET_CLIENT.name)}",
            f"--kubelet-client-key={p.client_key(pki_.KUBELET_CLIENT.name)}",
        )
    else:
        # The `kubernetes` Service would get 127.0.0.1 as its endpoint, which Endpoints validation rejects
        # (loopback), so the reconciler would log an error every few seconds. Nothing needs it without pods.
        node_flags = ("--endpoint-reconciler-type=none",)
    return Component(
        "kube-apiserver",
        (
            f"--etcd-servers=http://{LOOPBACK}:{ports.etcd_client}",
            f"--bind-address={network.api_host}",
            # Without it a host with no default route fails to pick an address to advertise.
            f"--advertise-address={network.api_host}",
            f"--secure-port={ports.apiserver}",
            f"--tls-cert-file={p.serving_cert}",
            f"--tls-private-key-file={p.serving_key}",
            f"--client-ca-file={p.ca_cert}",
            f"--requestheader-client-ca-file={p.ca_cert}",
            f"--requestheader-allowed-names={pki_.FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={p.client_cert(pki_.FRONT_PROXY_CLIENT)}",
            f"--proxy-client-key-file={p.client_key(pki_.FRONT_PROXY_CLIENT)}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p.sa_public_key}",
            f"--service-account-signing-key-file={p.sa_private_key}",
            f"--service-cluster-ip-range={network.service_cidr}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            *node_flags,
            "--profiling=false",
        ),
    )


def controller_manager(files: Files, ports: Ports, network: Network) -> Component:
    p = files.pki
    kubeconfig_path = files.component_kubeconfig("kube-controller-manager")
    return Component(
        "kube-controller-manager",
        (
            f"--kubeconfig={kubeconfig_path}",
            f"--authentication-kubeconfig={kubeconfig_path}",
            f"--authorization-kubeconfig={kubeconfig_path}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={ports.controller_manager}",
            f"--service-account-private-key-file={p.sa_private_key}",
            f"--root-ca-file={p.ca_cert}",
            f"--cluster-signing-cert-file={p.ca_cert}",
            f"--cluster-signing-key-file={p.ca_key}",
            f"--service-cluster-ip-range={network.service_cidr}",
            # Each controller acts under its own service account, as in a real cluster, so RBAC gaps show.
            "--use-service-account-credentials=true",
            "--controllers=*",
            "--leader-elect=false",
            "--profiling=false",
            f"--kube-api-qps={CLIENT_QPS}",
            f"--kube-api-burst={CLIENT_BURST}",
        ),
    )


def scheduler(files: Files, ports: Ports) -> Component:
    kubeconfig_path = files.component_kubeconfig("kube-scheduler")
    return Component(
        "kube-scheduler",
        (
            f"--config={files.scheduler_config}",
            f"--authentication-kubeconfig={kubeconfig_path}",
            f"--authorization-kubeconfig={kubeconfig_path}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={ports.scheduler}",
            "--profiling=false",
        ),
    )


def kwok(files: Files, network: Network) -> Component:
    return Component(
        "kwok",
        (
            f"--kubeconfig={files.component_kubeconfig('kwok')}",
            # Only our nodes; kwok refuses to start without one node-selection flag.
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}={KWOK_NODE_ANNOTATION_VALUE}",
            # --config replaces the default ~/.kwok/kwok.yaml, so a developer's own kwok setup never leaks in.
            f"--config={STAGES_FILE}",
            f"--node-ip={LOOPBACK}",
            f"--cidr={network.pod_cidr}",
            # kwok applies its 40 s default only to a KwokConfiguration object, which our --config lacks. Without
            # a lease the node-heartbeat-with-lease stage only posts status every ~10 minutes, the
            # controller-manager marks the nodes NotReady and taints them, and pods get evicted.
            "--node-lease-duration-seconds=40",
            # No --node-port and no --server-address: kwok then serves nothing (no logs/exec endpoints).
        ),
    )


def component_kubeconfigs(files: Files, ports: Ports, network: Network) -> Mapping[pathlib.Path, dict[str, Any]]:
    """The kubeconfig of every client: the admin one for users, one per component identity."""
    server = server_url(ports, network)
    configs = {files.kubeconfig: kubeconfig(server, files.pki, "admin", CONTEXT)}
    names = ["kube-controller-manager", "kube-scheduler", "kwok"]
    if network.real_node:
        names += [identity.name for identity in pki_.NODE_CLIENTS if identity != pki_.KUBELET_CLIENT]
    for name in names:
        configs[files.component_kubeconfig(name)] = kubeconfig(server, files.pki, name, CONTEXT)
    return configs
