"""The real-pod tier: the local control plane with a real node (epd_testenv.realnode: containerd, kubelet,
kube-proxy, CoreDNS on the harness's bridge in 198.18.0.0/15), the operator installed by its chart from its built
image, and the examples served by real containers the operator created.

One cluster for the whole package, in its own state folder (.run/test-real-node); the built images (the CPU
flavour of vLLM among them) are copied into the node's containerd once per build. When the package is done the
cluster stops and the machine must hold nothing of the node: no bridge, nftables table, KUBE-/CNI- chain, mount
or pod cgroup (nodehost.leftovers), or the teardown fails. Tests reach pods only through `kubectl port-forward`.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from epd_connectors.config.roles import Role
from epd_operator.api import constants as c
from epd_operator.derive import ports
from epd_operator.render.pod import RUN_AS_USER
from epd_testenv import cluster, keda, layout, nodehost, process, realdeploy, realnode
from tests.e2e.conftest import REPO, TIMINGS, progress
from tests.e2e.pods.kube import Kubectl, condition, eventually
from tests.e2e.test_local_e_p_d import Samples, samples
from tests.unit.packaging.image_list import cpu_tags

STATE_DIR = REPO / ".run" / "test-real-node"
OPERATOR_NAMESPACE = "epd-system"
RELEASE = "epd"
OPERATOR = f"{RELEASE}-epd-operator"
"""The chart's full name for this release: its Deployment, ServiceAccount and metrics Service prefix."""
ESCAPED_NODE_LABEL = realnode.REAL_NODE_LABEL.replace(".", "\\.")
"""The real node's label as a helm --set key (dots in a key are escaped)."""
READY_TIMEOUT_S = float(os.environ.get("EPD_PODS_READY_TIMEOUT_S", "900"))
"""Until an EPDDeployment is Ready: three vLLM pods load the model at once on 2 cores (about 2 minutes here)."""


@dataclass
class RealCluster:
    local: cluster.Cluster
    kubectl: Kubectl
    helm: pathlib.Path
    prometheus: keda.Prometheus
    """What KEDA queries (the operator's --prometheus-url); it scrapes what a test names."""

    def helm_run(self, *args: str) -> str:
        env = layout.helm_env(self.local.kubeconfig, self.local.state_dir / "helm")
        done = subprocess.run(
            [str(self.helm), *args], env=env, capture_output=True, text=True, timeout=300, check=False
        )
        assert done.returncode == 0, f"helm {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout


@pytest.fixture(scope="package")
def real_cluster(request: pytest.FixtureRequest) -> Iterator[RealCluster]:
    """The cluster with its real node, KEDA and the Prometheus it queries (epd_testenv.keda), and the operator
    installed by `helm install charts/epd-operator` pointed at that Prometheus."""
    say = progress(request.config)
    for name in ("kube-apiserver", "kubelet", "kube-proxy", "coredns", "pause", "kubectl", "helm", "keda-operator"):
        layout.binary(name)
    state_dir, claim = layout.claim_state_dir(STATE_DIR)
    settings = cluster.Settings(real_node=realnode.NodeNetwork(), node_images=layout.real_node_images())
    local = cluster.Cluster(state_dir, settings, say=say)
    kernel_before = nodehost.sysctls()
    with claim:
        began = time.monotonic()
        local.up()
        TIMINGS.add("real node: cluster up (images copied when rebuilt)", time.monotonic() - began)
        prometheus = keda.Prometheus(state_dir / "prometheus")
        autoscaler = keda.Keda(state_dir / "keda", local.kubeconfig, local.files.pki, realnode.NodeNetwork())
        try:
            began = time.monotonic()
            prometheus.start()
            autoscaler.start()
            TIMINGS.add("real node: Prometheus and KEDA serving external metrics", time.monotonic() - began)
            kubectl = Kubectl(layout.binary("kubectl"), local.kubeconfig)
            real = RealCluster(local, kubectl, layout.binary("helm"), prometheus)
            began = time.monotonic()
            real.helm_run(
                "install", RELEASE, str(REPO / "charts" / "epd-operator"),
                "--namespace", OPERATOR_NAMESPACE, "--create-namespace",
                "--set-string", f"nodeSelector.{ESCAPED_NODE_LABEL}=true",
                "--set", f"autoscaling.prometheusUrl={prometheus.url}",
                "--wait", "--timeout", "180s",
            )  # fmt: skip
            TIMINGS.add("real node: helm install, operator Ready", time.monotonic() - began)
            yield real
            if request.session.testsfailed:
                log = real.kubectl.run("logs", "-n", OPERATOR_NAMESPACE, f"deploy/{OPERATOR}", "--tail=60", check=False)
                say(f"--- operator log tail ---\n{log}")
        finally:
            autoscaler.stop()
            prometheus.stop()
            local.down()
    left = nodehost.leftovers(realnode.NodeNetwork(), local.node_files)
    assert not left, f"the real node left these on the machine: {left}"
    assert nodehost.sysctls() == kernel_before, "the kernel settings the kubelet changed were not restored"


# -- one EPDDeployment on real pods


def workload(name: str, role: Role) -> str:
    return f"{name}-{role.value}"


@dataclass
class RealEPD:
    """An example running on the real node, reached through port-forwards (kept open while it lives)."""

    kubectl: Kubectl
    name: str
    namespace: str
    endpoint: str = ""
    forwards: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    role_urls: dict[Role, str] = field(default_factory=dict)

    def get(self) -> dict[str, Any]:
        found: dict[str, Any] = self.kubectl.json("get", c.PLURAL, "-n", self.namespace, self.name)
        return found

    def forward(self, target: str, port: int) -> str:
        return self.forwards.enter_context(self.kubectl.port_forward(self.namespace, target, port))

    def url(self, role: Role) -> str:
        """A port-forward to the role's Service (opened on first use)."""
        if role not in self.role_urls:
            port = {Role.PROXY: ports.PROXY_PORT, Role.MASTER: MASTER_METRICS_PORT}.get(role, ports.VLLM_HTTP_PORT)
            self.role_urls[role] = self.forward(f"svc/{workload(self.name, role)}", port)
        return self.role_urls[role]

    def forget(self, role: Role) -> None:
        """Drop the role's port-forward: kubectl forwards a Service to the one pod it picked at start, so after
        that pod is replaced the next use must open a new one."""
        self.role_urls.pop(role, None)

    def metrics(self, role: Role) -> Samples:
        return samples(get_text(f"{self.url(role)}/metrics"))

    def store_keys(self) -> set[str]:
        text = get_text(f"{self.url(Role.MASTER)}/get_all_keys")
        return {line.strip() for line in text.splitlines() if line.strip()}

    @property
    def kv_prefix(self) -> str:
        return str(self.get()["status"]["kvCachePrefix"])

    def log(self, role: Role) -> str:
        return self.kubectl.run("logs", "-n", self.namespace, f"deploy/{workload(self.name, role)}", check=False)

    def pods(self) -> list[dict[str, Any]]:
        return self.kubectl.pods(self.namespace, f"{c.LABEL_INSTANCE}={self.name}")


MASTER_METRICS_PORT = 9003
"""spec.store.master.metricsPort's default (the examples keep it)."""


@pytest.fixture(scope="package")
def bridge_etcd(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A one-member etcd for HA masters, on the host's address on the harness's bridge (where pods reach the
    apiserver and CoreDNS too), so nothing but the bridge's pods and this machine reach it; HOST:PORT."""
    gateway = realnode.NodeNetwork().gateway
    client_port, peer_port = process.free_ports(2)
    client, peer = f"http://{gateway}:{client_port}", f"http://127.0.0.1:{peer_port}"
    data = tmp_path_factory.mktemp("bridge-etcd")
    argv = [
        str(layout.binary("etcd")),
        f"--data-dir={data / 'data'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=default={peer}",
    ]
    with (data / "etcd.log").open("wb") as log:
        etcd = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:

        def healthy() -> bool:
            try:
                return b'"true"' in get_text(f"{client}/health").encode()
            except OSError:
                return False

        eventually(healthy, f"etcd at {client}", 30, poll_s=0.2)
        yield client.removeprefix("http://")
    finally:
        etcd.kill()
        etcd.wait(timeout=30)


def get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def tiny_model_for_pods(tiny_model: pathlib.Path) -> pathlib.Path:
    """The model folder as a hostPath the pods' user can read (every folder above it searchable)."""
    for folder in (tiny_model, *tiny_model.parents):
        assert folder.stat().st_mode & 0o005 == 0o005 or folder == pathlib.Path("/"), (
            f"{folder} is not readable by the pods' user {RUN_AS_USER}"
        )
    return tiny_model


@dataclass
class Applied:
    """An example applied to the cluster and not yet waited for."""

    epd: RealEPD
    label: str
    began: float


@contextlib.contextmanager
def applied(
    real: RealCluster,
    example: pathlib.Path,
    tiny_model: pathlib.Path,
    workdir: pathlib.Path,
    *,
    label: str,
    max_surge: int = 0,
    transfer_check: dict[str, Any] | None = None,
    master_ha: dict[str, Any] | None = None,
) -> Iterator[Applied]:
    """The example applied with realdeploy's changes; deleted at the end, and gone (every child and container)
    before the next one starts."""
    shared = workdir / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    os.chown(shared, RUN_AS_USER, RUN_AS_USER)
    site = realdeploy.RealNodeSite(cpu_tags()["vllm"], tiny_model_for_pods(tiny_model), shared)
    owner, manifest = realdeploy.manifest(
        example, site, max_surge=max_surge, transfer_check=transfer_check, master_ha=master_ha
    )
    kubectl = real.kubectl
    began = time.monotonic()
    kubectl.apply(json.dumps(manifest))
    epd = RealEPD(kubectl, owner.name, owner.namespace)
    try:
        yield Applied(epd, label, began)
    finally:
        kubectl.run("delete", c.PLURAL, "-n", owner.namespace, owner.name, "--wait=true", "--timeout=120s", check=False)
        eventually(lambda: not epd.pods(), f"every pod of {label} gone", 180, poll_s=2)


@contextlib.contextmanager
def ready(request: pytest.FixtureRequest, it: Applied) -> Iterator[RealEPD]:
    """The applied example once Ready, its proxy forwarded; the tail of every pod's log when a test failed."""
    say = progress(request.config)
    epd = it.epd
    eventually(lambda: ready_or_why(epd.get()), f"{it.label} Ready on the real node", READY_TIMEOUT_S, poll_s=2)
    TIMINGS.add(f"{it.label} on real pods: applied to Ready", time.monotonic() - it.began)
    say(f"{it.label}: Ready on real pods in {time.monotonic() - it.began:.0f} s")
    with epd.forwards:
        epd.endpoint = epd.url(Role.PROXY)
        yield epd
        if request.session.testsfailed:
            for pod in epd.pods():
                name = pod["metadata"]["name"]
                tail = epd.kubectl.run("logs", "-n", epd.namespace, name, "--tail=30", check=False)
                say(f"--- pod {name} log tail ---\n{tail}")


E_P_D_EXAMPLE = REPO / "examples" / "local-e-p-d.yaml"
E_P_D_CANARIES = {"timeoutSeconds": 10}
"""spec.proxy.transferCheck of the E+P+D: a canary gives up after 10 s (30 by default), so a broken path shows
sooner; the interval stays 60 s, so few canaries land among the decode counters the first tests read."""


@pytest.fixture(scope="package")
def e_p_d_applied(
    real_cluster: RealCluster, bridge_etcd: str, tiny_model: pathlib.Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Applied]:
    """The E+P+D that test_e_p_d.py takes through its lifecycle, applied as the package starts: test_e_pd.py asks
    for it first, so its pods load together with the E+PD's (on 2 cores five vLLM pods loading at once are all
    Ready sooner than two and then three) and it is Ready by the time the E+PD is done. HA masters through the
    bridge's etcd; the model roles roll with maxSurge 1 (with the default of replacing one pod at a time, a role
    of one replica is down while its new pod loads)."""
    with applied(
        real_cluster,
        E_P_D_EXAMPLE,
        tiny_model,
        tmp_path_factory.mktemp("e-p-d"),
        label="E+P+D",
        max_surge=1,
        transfer_check=E_P_D_CANARIES,
        master_ha={"replicas": 2, "etcdEndpoints": [bridge_etcd]},
    ) as it:
        yield it


MODULE_ORDER = ("test_e_pd.py", "test_e_p_d.py", "test_real_node.py")
"""The E+PD first: its tests run while the E+P+D's pods, applied with it, load."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = pathlib.Path(__file__).parent
    slots = [i for i, item in enumerate(items) if item.path.parent == here]
    ordered = sorted(
        (items[i] for i in slots),
        key=lambda item: MODULE_ORDER.index(item.path.name) if item.path.name in MODULE_ORDER else len(MODULE_ORDER),
    )
    for slot, item in zip(slots, ordered, strict=True):
        items[slot] = item


def is_ready(obj: dict[str, Any]) -> bool:
    ready = condition(obj, "Ready")
    return ready is not None and ready.get("status") == "True"


def ready_or_why(obj: dict[str, Any]) -> bool:
    """True once Ready; else raises with the Ready condition's reason and message, which a timed-out wait shows
    (the operator's own account: a transfer path failing its canaries names the pair and the address)."""
    if is_ready(obj):
        return True
    ready = condition(obj, "Ready") or {}
    raise AssertionError(f"not Ready: {ready.get('reason')}: {ready.get('message')}")
