"""The real node and the operator on it: what a pod gets here, and what the harness keeps off the machine.

The operator's pod (from its built image, installed by its chart) is the pod these checks look into: its
address and routes, its DNS, `kubectl logs`, `exec` and `port-forward`. Nothing here connects to an address
outside the harness's range: "no route out" is read from the pod's routing table, not tried.
"""

from __future__ import annotations

import ipaddress
import urllib.request
from typing import Any

import pytest

from epd_testenv import nodehost, nodes, realnode
from tests.e2e.pods.conftest import OPERATOR, OPERATOR_NAMESPACE, RealCluster
from tests.unit.packaging.image_list import tags

pytestmark = [pytest.mark.e2e, pytest.mark.pods, pytest.mark.timeout(900)]

NETWORK = realnode.NodeNetwork()


def operator_pod(real: RealCluster) -> dict[str, Any]:
    pods = real.kubectl.pods(OPERATOR_NAMESPACE, "app.kubernetes.io/name=epd-operator")
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def in_operator_pod(real: RealCluster, code: str) -> str:
    """Python run inside the operator's container (`kubectl exec`)."""
    name = operator_pod(real)["metadata"]["name"]
    return real.kubectl.run("exec", "-n", OPERATOR_NAMESPACE, name, "--", "python", "-c", code)


def test_the_real_node_is_ready_with_gpus_beside_the_simulated_ones(real_cluster: RealCluster) -> None:
    node = real_cluster.kubectl.json("get", "node", realnode.NODE_NAME)
    assert nodes.is_ready(node)
    assert node["metadata"]["labels"][realnode.REAL_NODE_LABEL] == "true"
    assert node["status"]["allocatable"][nodes.GPU_RESOURCE] == str(realnode.GPUS)
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == NETWORK.gateway
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    simulated = real_cluster.kubectl.json("get", "nodes", "-l", f"{nodes.SIMULATED_LABEL}=true")["items"]
    assert len(simulated) == nodes.NodePool().count and all(nodes.is_ready(n) for n in simulated)


def test_the_operator_runs_from_its_image_under_the_charts_service_account(real_cluster: RealCluster) -> None:
    pod = operator_pod(real_cluster)
    assert pod["spec"]["nodeName"] == realnode.NODE_NAME
    assert pod["spec"]["serviceAccountName"] == OPERATOR
    (status,) = pod["status"]["containerStatuses"]
    assert status["ready"] and status["image"].endswith(tags()["operator"]), status
    log = real_cluster.kubectl.run("logs", "-n", OPERATOR_NAMESPACE, pod["metadata"]["name"])
    assert "Activity 'startup' succeeded" in log, log[-2000:]
    with (
        real_cluster.kubectl.port_forward(OPERATOR_NAMESPACE, f"svc/{OPERATOR}-metrics", 9090) as url,
        urllib.request.urlopen(f"{url}/metrics", timeout=10) as response,
    ):
        page = response.read().decode()
    assert "epd_operator_reconciles" in page


def test_a_pod_has_an_address_on_the_bridge_cluster_dns_and_no_route_out(real_cluster: RealCluster) -> None:
    pod_ip = ipaddress.ip_address(operator_pod(real_cluster)["status"]["podIP"])
    assert pod_ip in ipaddress.ip_network(NETWORK.pod_cidr)
    routes = in_operator_pod(
        real_cluster,
        "import socket, struct\n"
        "for line in open('/proc/net/route').read().splitlines()[1:]:\n"
        "    f = line.split()\n"
        "    ip = lambda h: socket.inet_ntoa(struct.pack('<L', int(h, 16)))\n"
        "    print(ip(f[1]), ip(f[7]), ip(f[2]))\n",
    ).split("\n")
    table = {tuple(r.split()[:2]) for r in routes if r}
    pod_net, service_net = ipaddress.ip_network(NETWORK.pod_cidr), ipaddress.ip_network(NETWORK.service_cidr)
    assert table == {
        (str(pod_net.network_address), str(pod_net.netmask)),
        (str(service_net.network_address), str(service_net.netmask)),
    }, f"a pod's routes must be the two ranges only (no default route): {routes}"
    resolved = in_operator_pod(
        real_cluster,
        "import socket\n"
        "print(socket.gethostbyname('kubernetes.default.svc'))\n"
        "try:\n"
        "    socket.gethostbyname('nothing.invalid')\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n",
    ).split()
    assert resolved[0] == NETWORK.kubernetes_service_ip
    assert resolved[1] == "refused", f"a name outside the cluster resolved: {resolved}"


def test_the_node_added_no_iptables_chain_and_kept_the_loopback_path(real_cluster: RealCluster) -> None:
    """The kubelet's KUBE-FIREWALL drops traffic to 127.0.0.0/8 from other sources (it broke every loopback
    flow of this project once): with makeIPTablesUtilChains off and kube-proxy in nftables mode, the node adds
    no KUBE-/CNI- chain at all; kube-proxy's rules are in its own nftables tables."""
    assert nodehost.added_chains(real_cluster.local.node_files) == []
    assert nodehost.kube_proxy_tables() != [], "kube-proxy (nftables mode) made no table: is it running?"
