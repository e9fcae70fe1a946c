"""The real node's config files and command lines (epd_testenv.realnode), as pure data: the settings each failure
on this machine kind needed, and the network rule (198.18.0.0/15 only, no route or masquerade out)."""

from __future__ import annotations

import ipaddress
import pathlib
import tomllib
from typing import Any

import pytest
import yaml

from epd_testenv import components, nodes, pki, realnode

pytestmark = pytest.mark.unit

NETWORK = realnode.NodeNetwork()
FILES = realnode.NodeFiles(pathlib.Path("/state"), pathlib.Path("/cache/containerd"))
PORTS = realnode.NodePorts(10001, 10002, 10003, 10004, 10005)
KUBECONFIGS = {
    name: pathlib.Path(f"/state/config/{name}.kubeconfig") for name in ("epd-real-node", "kube-proxy", "coredns")
}


def written() -> dict[pathlib.Path, str]:
    return realnode.config_files(NETWORK, FILES, PORTS, pathlib.Path("/state/pki/ca.crt"), KUBECONFIGS)


def test_addresses_outside_the_test_range_are_refused() -> None:
    with pytest.raises(ValueError, match=r"outside 198\.18\.0\.0/15"):
        realnode.NodeNetwork(pod_cidr="10.0.0.0/16", gateway="10.0.0.1")
    with pytest.raises(ValueError, match="outside"):
        realnode.NodeNetwork(service_cidr="192.168.0.0/16")
    with pytest.raises(ValueError, match="not in the pod range"):
        realnode.NodeNetwork(gateway="198.19.0.1")
    assert NETWORK.kubernetes_service_ip == "198.19.0.1"


def test_pods_get_routes_to_the_two_ranges_only_and_no_masquerade() -> None:
    conflist = realnode.cni_conflist(NETWORK, FILES)
    bridge = conflist["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["bridge"] == NETWORK.bridge
    assert bridge["ipMasq"] is False and not bridge.get("isDefaultGateway")
    assert bridge["ipam"]["routes"] == [{"dst": NETWORK.service_cidr, "gw": NETWORK.gateway}]
    for (subnet,) in bridge["ipam"]["ranges"]:
        assert ipaddress.IPv4Network(subnet["subnet"]).subnet_of(ipaddress.IPv4Network("198.18.0.0/15"))


def test_the_fence_drops_what_would_leave_the_bridge() -> None:
    fence = realnode.fence(NETWORK)
    assert f'iifname "{NETWORK.bridge}" oifname != "{NETWORK.bridge}" drop' in fence
    assert f"ip daddr {NETWORK.service_cidr} drop" in fence


def test_the_kubelet_keeps_off_iptables_and_accepts_this_machine() -> None:
    config = yaml.safe_load(written()[FILES.kubelet_config])
    assert config["makeIPTablesUtilChains"] is False, "KUBE-FIREWALL breaks the loopback flows"
    assert config["failCgroupV1"] is False and config["cgroupDriver"] == "cgroupfs"
    assert config["address"] == NETWORK.gateway and config["clusterDNS"] == [NETWORK.gateway]
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["imageGCHighThresholdPercent"] == 100, "imported images must never be collected"
    assert written()[FILES.resolv_conf] == f"nameserver {NETWORK.gateway}\n"


def test_kube_proxy_uses_its_own_nftables_tables_and_the_bridge_only() -> None:
    config = yaml.safe_load(written()[FILES.proxy_config])
    assert config["mode"] == "nftables"
    assert config["nodePortAddresses"] == [f"{NETWORK.gateway}/32"]
    assert config["conntrack"]["maxPerCore"] == 0
    assert config["healthzBindAddress"].startswith(f"{components.LOOPBACK}:")


def test_coredns_answers_cluster_names_and_forwards_nothing() -> None:
    corefile = written()[FILES.corefile]
    assert f"bind {NETWORK.gateway}" in corefile and "kubernetes cluster.local" in corefile
    assert "forward" not in corefile


def test_containerd_never_pulls_and_keeps_its_namespaces_in_our_folder() -> None:
    config = tomllib.loads(written()[FILES.containerd_config])
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == realnode.PAUSE_IMAGE
    assert cri["restrict_oom_score_adj"] is True, "without CAP_SYS_RESOURCE every sandbox fails otherwise"
    assert cri["netns_mounts_under_state_dir"] is True
    assert config["state"].startswith(str(FILES.dir)) and config["root"] == str(FILES.containerd_root)


def test_the_kubelet_is_a_node_identity_and_kube_proxy_the_node_proxier() -> None:
    by_name = {identity.name: identity for identity in pki.NODE_CLIENTS}
    kubelet = by_name[realnode.NODE_NAME]
    assert kubelet.user == f"system:node:{realnode.NODE_NAME}" and kubelet.groups == ("system:nodes",)
    assert by_name["kube-proxy"].user == "system:kube-proxy"


def test_placement_reaches_every_component_even_ones_the_manifest_leaves_out() -> None:
    spec: dict[str, Any] = {"model": {}, "store": {"mode": "standalone"}}
    nodes.place_on(spec, {"pool": "sim"})
    for path in (("encoder",), ("decode",), ("proxy",), ("store", "master"), ("store", "clients")):
        section = spec
        for key in path:
            section = section[key]
        assert section["nodeSelector"] == {"pool": "sim"}, path
    assert "prefill" not in spec, "a prefill section would turn a PD deployment into a disaggregated one"
