"""The real node beside the simulated ones: its addresses, config files and command lines, as pure functions.

One node per machine runs real containers: containerd with runc and the CNI bridge, the kubelet and kube-proxy
from the pinned Kubernetes module, CoreDNS for Service names. Every address is inside 198.18.0.0/15 (reserved
for network tests) on a bridge the harness creates (nodehost.py): pods on 198.18.0.0/16, Services on
198.19.0.0/16, the host's side of the bridge (198.18.0.1) is the node's InternalIP, the apiserver's address
for pods, and their DNS server. No masquerade and no route out; tests reach pods by `kubectl port-forward`.
Each setting below that departs from a default was needed here (shared/docs/k8s-testenv.md says which failure).
"""

from __future__ import annotations

import ipaddress
import json
import pathlib
import shutil
from dataclasses import dataclass
from typing import Any

import yaml

from epd_testenv import components, pki

NODE_NAME = pki.REAL_NODE_NAME
REAL_NODE_LABEL = "epd.testenv/real-node"
"""Label on the real node, so a test or the demo can place pods on it with a nodeSelector."""
GPUS = 8
"""nvidia.com/gpu the node advertises (a status patch; the kubelet keeps it): GPU pods schedule here and run
on the CPU."""

KUBELET_PORT = 10250
CNI_BIN_DIR = pathlib.Path("/usr/lib/cni")
"""Debian's containernetworking-plugins (bridge, host-local, portmap)."""
CNI_NETWORK = "epd-real-node"
PAUSE_IMAGE = "localhost/epd/pause:1"
"""The pod sandbox image (tools/k8s/pause), imported into containerd by nodeimages; nothing is ever pulled."""
FENCE_TABLE = "epd-testenv-fence"
CONTAINERD_NAMESPACE = "k8s.io"
"""The containerd namespace the CRI plugin keeps the kubelet's images and containers in."""


@dataclass(frozen=True)
class NodeNetwork:
    """The real node's addresses. Only one real node runs on a machine at a time (nodehost.prepare refuses a second)."""

    bridge: str = "epd-br0"
    gateway: str = "198.18.0.1"
    """The host's address on the bridge: node InternalIP, kubelet, apiserver (for pods) and CoreDNS."""
    pod_cidr: str = "198.18.0.0/16"
    service_cidr: str = "198.19.0.0/16"

    def __post_init__(self) -> None:
        allowed = ipaddress.IPv4Network("198.18.0.0/15")
        for cidr in (self.pod_cidr, self.service_cidr):
            if not ipaddress.IPv4Network(cidr).subnet_of(allowed):
                raise ValueError(f"{cidr} is outside 198.18.0.0/15, the only range real pods may use")
        if ipaddress.ip_address(self.gateway) not in ipaddress.ip_network(self.pod_cidr):
            raise ValueError(f"gateway {self.gateway} is not in the pod range {self.pod_cidr}")

    @property
    def prefix_length(self) -> int:
        return ipaddress.ip_network(self.pod_cidr).prefixlen

    @property
    def kubernetes_service_ip(self) -> str:
        """The ClusterIP the apiserver gives the `kubernetes` Service (the first of the range)."""
        return str(next(ipaddress.ip_network(self.service_cidr).hosts()))

    def control_plane(self) -> components.Network:
        """The cluster's address plan with this node: the apiserver on the gateway, Services in our range; kwok's
        simulated pods keep their loopback range (nothing connects to them)."""
        return components.Network(service_cidr=self.service_cidr, api_host=self.gateway)


@dataclass(frozen=True)
class NodePorts:
    """Loopback ports of the node's health and metrics endpoints, picked at start."""

    kubelet_healthz: int
    proxy_healthz: int
    proxy_metrics: int
    dns_health: int
    dns_ready: int


@dataclass(frozen=True)
class NodeFiles:
    """Where the real node keeps its files. Containerd's root (images, snapshots) is a cache shared by every
    cluster on the machine, so the role images are imported once; the rest lives in the cluster's folder."""

    state: pathlib.Path
    """The cluster's state folder."""
    containerd_root: pathlib.Path

    @property
    def dir(self) -> pathlib.Path:
        return self.state / "node"

    @property
    def containerd_state(self) -> pathlib.Path:
        return self.dir / "containerd-state"

    @property
    def containerd_socket(self) -> pathlib.Path:
        return self.dir / "containerd.sock"

    @property
    def ctr(self) -> list[str]:
        """`ctr` against this node's containerd, in the CRI plugin's namespace (argv up to the subcommand)."""
        return ["ctr", "--address", str(self.containerd_socket), "--namespace", CONTAINERD_NAMESPACE]

    @property
    def containerd_config(self) -> pathlib.Path:
        return self.dir / "containerd.toml"

    @property
    def cni_conf_dir(self) -> pathlib.Path:
        return self.dir / "cni"

    @property
    def cni_data_dir(self) -> pathlib.Path:
        """host-local's address leases."""
        return self.dir / "cni-ipam"

    @property
    def kubelet_root(self) -> pathlib.Path:
        return self.dir / "kubelet"

    @property
    def kubelet_config(self) -> pathlib.Path:
        return self.dir / "kubelet.yaml"

    @property
    def resolv_conf(self) -> pathlib.Path:
        """The resolver pods with dnsPolicy Default get, and the base of ClusterFirst ones: our DNS only."""
        return self.dir / "resolv.conf"

    @property
    def proxy_config(self) -> pathlib.Path:
        return self.dir / "kube-proxy.yaml"

    @property
    def corefile(self) -> pathlib.Path:
        return self.dir / "Corefile"


def containerd_config(files: NodeFiles) -> str:
    """containerd 1.6's config (TOML, version 2), written by hand: the few keys we set are all strings and
    booleans, and the tomllib of the standard library reads but does not write."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    runc = shutil.which("runc") or "/usr/sbin/runc"
    lines = [
        "version = 2",
        f'root = "{files.containerd_root}"',
        f'state = "{files.containerd_state}"',
        # Plugins that write outside our folders (/opt/containerd) or that this machine cannot use.
        'disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs", '
        '"io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", '
        '"io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp"]',
        "[grpc]",
        f'  address = "{files.containerd_socket}"',
        f"[{cri}]",
        f'  sandbox_image = "{PAUSE_IMAGE}"',
        # Processes here lack CAP_SYS_RESOURCE: the pause container's oom_score_adj -998 would be refused and
        # every sandbox fail with runc's "can't get final child's PID from pipe: EOF".
        "  restrict_oom_score_adj = true",
        # Pod network namespaces under our state folder, not /run/netns, so cleanup finds exactly ours.
        "  netns_mounts_under_state_dir = true",
        '  stream_server_address = "127.0.0.1"',
        '  stream_server_port = "0"',
        f"[{cri}.cni]",
        f'  bin_dir = "{CNI_BIN_DIR}"',
        f'  conf_dir = "{files.cni_conf_dir}"',
        "  max_conf_num = 1",
        f"[{cri}.containerd]",
        '  snapshotter = "overlayfs"',
        '  default_runtime_name = "runc"',
        f"[{cri}.containerd.runtimes.runc]",
        '  runtime_type = "io.containerd.runc.v2"',
        f"[{cri}.containerd.runtimes.runc.options]",
        f'  BinaryName = "{runc}"',
        "  SystemdCgroup = false",
    ]
    return "\n".join(lines) + "\n"


def cni_conflist(network: NodeNetwork, files: NodeFiles) -> dict[str, Any]:
    """bridge (the host is the gateway; no masquerade, so nothing routes out) + host-local + portmap."""
    return {
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": network.bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(files.cni_data_dir),
                    "ranges": [[{"subnet": network.pod_cidr, "gateway": network.gateway}]],
                    # No default route in pods: only the Service range, through the host (kube-proxy).
                    "routes": [{"dst": network.service_cidr, "gw": network.gateway}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(network: NodeNetwork, files: NodeFiles, ports: NodePorts, ca_cert: pathlib.Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": network.gateway,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": components.LOOPBACK,
        "healthzPort": ports.kubelet_healthz,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_cert)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{files.containerd_socket}",
        # The machine has cgroup v1 (cgroup2 only as the hybrid "unified" mount) and no systemd.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        # The kubelet's KUBE-FIREWALL chain drops packets to 127.0.0.0/8 from other sources: it broke every
        # loopback E+P+D flow of this project when a kubelet left it behind.
        "makeIPTablesUtilChains": False,
        "clusterDNS": [network.gateway],
        "clusterDomain": "cluster.local",
        "resolvConf": str(files.resolv_conf),
        # The role images are imported, never pulled: garbage-collecting them would make pods fail.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "200Mi",
            "nodefs.available": "2%",
            "imagefs.available": "2%",
            "nodefs.inodesFree": "2%",
        },
        "serializeImagePulls": False,
        "registerNode": True,
        "maxPods": 110,
    }


def kube_proxy_config(network: NodeNetwork, ports: NodePorts, kubeconfig: pathlib.Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        # nftables: kube-proxy's rules live in its own tables, never in the machine's iptables chains.
        "mode": "nftables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "bindAddress": network.gateway,
        "clusterCIDR": network.pod_cidr,
        "detectLocalMode": "ClusterCIDR",
        "healthzBindAddress": f"{components.LOOPBACK}:{ports.proxy_healthz}",
        "metricsBindAddress": f"{components.LOOPBACK}:{ports.proxy_metrics}",
        # NodePorts only on the bridge (the default opens them on every address of the machine).
        "nodePortAddresses": [f"{network.gateway}/32"],
        # Zero: leave the machine's conntrack sysctls as they are.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }


def corefile(network: NodeNetwork, ports: NodePorts, kubeconfig: pathlib.Path) -> str:
    """Cluster names only: no forward plugin, so a name outside cluster.local is refused, never sent on."""
    return (
        ".:53 {\n"
        f"    bind {network.gateway}\n"
        "    errors\n"
        f"    health {components.LOOPBACK}:{ports.dns_health}\n"
        f"    ready {components.LOOPBACK}:{ports.dns_ready}\n"
        "    kubernetes cluster.local in-addr.arpa ip6.arpa {\n"
        f"        kubeconfig {kubeconfig} {components.CONTEXT}\n"
        "        pods insecure\n"
        "        ttl 5\n"
        "    }\n"
        "    cache 5\n"
        "}\n"
    )


def containerd(files: NodeFiles) -> components.Component:
    return components.Component("containerd", (f"--config={files.containerd_config}",), binary="containerd")


def kubelet(network: NodeNetwork, files: NodeFiles, kubeconfig: pathlib.Path) -> components.Component:
    return components.Component(
        "kubelet",
        (
            f"--config={files.kubelet_config}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={files.kubelet_root}",
            f"--cert-dir={files.kubelet_root / 'pki'}",
            f"--hostname-override={NODE_NAME}",
            # The kubelet refuses a loopback node IP; the bridge's address is ours.
            f"--node-ip={network.gateway}",
            f"--node-labels={REAL_NODE_LABEL}=true,nvidia.com/gpu.present=true",
        ),
    )


def kube_proxy(files: NodeFiles) -> components.Component:
    return components.Component("kube-proxy", (f"--config={files.proxy_config}",))


def coredns(files: NodeFiles) -> components.Component:
    return components.Component("coredns", (f"-conf={files.corefile}",))


def config_files(
    network: NodeNetwork,
    files: NodeFiles,
    ports: NodePorts,
    ca_cert: pathlib.Path,
    kubeconfigs: dict[str, pathlib.Path],
) -> dict[pathlib.Path, str]:
    """Every file the node's processes read, by path."""
    return {
        files.containerd_config: containerd_config(files),
        files.cni_conf_dir / f"10-{CNI_NETWORK}.conflist": json.dumps(cni_conflist(network, files), indent=2),
        files.kubelet_config: yaml.safe_dump(kubelet_config(network, files, ports, ca_cert), sort_keys=False),
        files.resolv_conf: f"nameserver {network.gateway}\n",
        files.proxy_config: yaml.safe_dump(
            kube_proxy_config(network, ports, kubeconfigs["kube-proxy"]), sort_keys=False
        ),
        files.corefile: corefile(network, ports, kubeconfigs["coredns"]),
    }


def fence(network: NodeNetwork) -> str:
    """An nftables table of the harness (`nft -f -`): nothing from the bridge is forwarded to another interface,
    and nothing is forwarded to a Service address kube-proxy did not translate (a removed Service's IP would
    otherwise follow the machine's default route)."""
    return (
        f"table inet {FENCE_TABLE} {{\n"
        "  chain forward {\n"
        "    type filter hook forward priority 0; policy accept;\n"
        f'    iifname "{network.bridge}" oifname != "{network.bridge}" drop\n'
        f"    ip daddr {network.service_cidr} drop\n"
        "  }\n"
        "}\n"
    )


def gpu_status_patch() -> dict[str, Any]:
    """Adds GPUs to the node's capacity, as the NVIDIA device plugin would."""
    gpus = str(GPUS)
    return {"status": {"capacity": {"nvidia.com/gpu": gpus}, "allocatable": {"nvidia.com/gpu": gpus}}}
