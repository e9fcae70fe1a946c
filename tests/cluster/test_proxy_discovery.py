"""The proxy's Kubernetes discovery against real EndpointSlices, run as the operator renders it.

The default test cluster gives simulated pods loopback IPs, which the API server refuses in EndpointSlices, so
its Services have none. This module starts a control plane of its own whose pod range is outside loopback
(198.18.0.0/16, reserved for benchmarking by RFC 2544), so the EndpointSlice controller publishes the simulated
pods. The operator reconciles E/P/D EPDDeployments there, and a real `epd-proxy` runs on loopback exactly as the
rendered proxy Deployment starts it: the container's command (`epd-launch proxy --bundle ...`) and env, the
bundle from its ConfigMap (whose env turns discovery on), and the credentials of its ServiceAccount (a
TokenRequest token), so the rendered Role is what lets it watch. The test only adds where it listens
(loopback, a free port), `EPD_PROXY_PROBE_INTERVAL=0`, an info log level, KUBECONFIG, and 127.0.0.1 for the
downward API's pod IP (which the proxy does not use).

Network rule: nothing may connect to a simulated pod's address. The proxy's active health probing is off
(probe interval 0, see epd_connectors.proxy.settings.Limits.probing) and no client request is sent through
it; the tests read only its /health and /metrics on loopback, and the proxy's backend request counter stays 0.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from epd_connectors.config.roles import Role
from epd_operator.api import constants as c
from epd_testenv import cluster, components, layout
from tests.cluster.operator_fixtures import (
    CRD_FILE,
    EPD_PATH,
    EXAMPLES,
    NAMESPACE_PREFIX,
    Kube,
    Operator,
    condition,
    eventually,
    example,
    free_port,
    prometheus_samples,
)
from tests.cluster.test_chart_operator import token_kubeconfig

pytestmark = pytest.mark.cluster
pytest_plugins = ["tests.cluster.operator_fixtures"]

POD_CIDR = "198.18.0.0/16"
"""Outside loopback, so EndpointSlices accept the pods' addresses; nothing here connects to it."""
STATE_DIR = layout.TEST_CLUSTER_DIR.with_name("test-cluster-slices")
"""Apart from the session's test cluster (and from a concurrent session's: claim_state_dir adds -2, -3, ...)."""
OFFLOAD = next(p for p in EXAMPLES if p.name == "e-p-d-store-offload.yaml")
ROLES = ("encoder", "prefill", "decode")
"""The roles the proxy routes to in an E/P/D deployment (the roster's roles, the pods' role label)."""
PROXY_START_S = 30.0
SHORT_S = 3.0
"""How long a roster that is already current gets to take in a change it should not miss: EndpointSlice
updates reach the watch within about a second."""


# -- the control plane with EndpointSlices, the operator, the deployments


@pytest.fixture(scope="module")
def slices_cluster() -> Iterator[cluster.Cluster]:
    """A control plane whose pods get addresses EndpointSlices accept; stopped when the module is done."""
    for name in ("kube-apiserver", "kwok"):
        layout.binary(name)
    state_dir, claim = layout.claim_state_dir(layout.repo_root() / STATE_DIR)
    with claim:
        local = cluster.Cluster(state_dir, cluster.Settings(network=components.Network(pod_cidr=POD_CIDR)))
        local.up()
        try:
            yield local
        finally:
            local.down()


@pytest.fixture(scope="module")
def admin(slices_cluster: cluster.Cluster) -> Iterator[Kube]:
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(slices_cluster.kubeconfig), client_configuration=configuration)  # type: ignore[no-untyped-call]
    api = client.ApiClient(configuration)
    try:
        yield Kube(api)
    finally:
        api.close()  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def operator(
    admin: Kube, slices_cluster: cluster.Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    """The CRD installed and the operator running against this module's cluster (overrides the plugin's, whose
    log-on-failure hook then prints this one's log)."""
    doc: dict[str, Any] = yaml.safe_load(CRD_FILE.read_text())
    admin.apply(doc, manager="epd-tests")
    crd_path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{doc['metadata']['name']}"
    eventually("the CRD established", lambda: condition(admin.get(crd_path), "Established").get("status") == "True")
    eventually("the EPDDeployment API to answer", lambda: admin.find(f"/apis/{c.API_VERSION}/{c.PLURAL}") is not None)
    running = Operator(slices_cluster.kubeconfig, tmp_path_factory.mktemp("operator") / "operator.log")
    running.start()
    try:
        yield running
    finally:
        running.stop()


def ready_epd(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    live = kube.epd(ns, name)
    st = live.get("status") or {}
    if st.get("observedGeneration") == live["metadata"]["generation"] and (
        condition(live, c.COND_READY).get("status") == "True"
    ):
        return live
    return None


@dataclass(frozen=True)
class Served:
    """The module's namespace and its two EPDDeployments."""

    ns: str
    main: str
    """E/P/D with one prefill pool; the tests scale it and make its pods unready."""
    pools: str
    """The example as it is: a second prefill pool of TP 2."""


@pytest.fixture(scope="module")
def served(admin: Kube, operator: Operator) -> Served:
    """Both deployments created at once and Ready. The cluster goes down with the module: no cleanup."""
    ns = f"{NAMESPACE_PREFIX}proxy-slices-{uuid.uuid4().hex[:5]}"
    admin.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    main = example(OFFLOAD, ns, "vl")
    del main["spec"]["prefill"]["additionalPools"]
    main["spec"]["decode"]["tensorParallelSize"] = 1  # must divide the store TP, now the one pool's 1
    pools = example(OFFLOAD, ns, "pools")
    for doc in (main, pools):
        admin.request("POST", EPD_PATH.format(ns=ns), doc)
    for doc in (main, pools):
        name = doc["metadata"]["name"]
        eventually(f"{ns}/{name} Ready", functools.partial(ready_epd, admin, ns, name))
    return Served(ns, main["metadata"]["name"], pools["metadata"]["name"])


# -- reading the cluster


def ready_pods(kube: Kube, ns: str, deployment: str) -> dict[str, list[str]]:
    """Per role, the IPs of the deployment's Ready pods that are not being deleted."""
    found: dict[str, list[str]] = {role: [] for role in ROLES}
    for pod in kube.items(f"/api/v1/namespaces/{ns}/pods?labelSelector={c.LABEL_DEPLOYMENT}={deployment}"):
        role = pod["metadata"]["labels"].get(c.LABEL_ROLE)
        ready = condition(pod, "Ready").get("status") == "True"
        if role in found and ready and not pod["metadata"].get("deletionTimestamp"):
            found[role].append(pod["status"]["podIP"])
    return {role: sorted(ips) for role, ips in found.items()}


def sliced_addresses(kube: Kube, ns: str, service: str) -> list[str]:
    """The ready, not terminating addresses in a Service's EndpointSlices."""
    slices = kube.items(
        f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector=kubernetes.io/service-name={service}"
    )
    return sorted(
        address
        for s in slices
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready") and not (e.get("conditions") or {}).get("terminating")
        for address in e["addresses"]
    )


def set_pod_ready(kube: Kube, ns: str, ip: str, ready: bool) -> str:
    """Flip the Ready condition of the pod with this IP, as a kubelet would when its readiness probe fails.
    kwok leaves it so (its pod-ready stage only touches Pending pods). Returns the pod's name."""
    pod = next(p for p in kube.items(f"/api/v1/namespaces/{ns}/pods") if p["status"].get("podIP") == ip)
    name: str = pod["metadata"]["name"]
    value = "True" if ready else "False"
    kube.request(
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/{name}/status",
        {"status": {"conditions": [{"type": "Ready", "status": value}, {"type": "ContainersReady", "status": value}]}},
        "application/strategic-merge-patch+json",
    )
    return name


# -- the proxy, started as its pod would be


@dataclass
class Proxy:
    """One `epd-proxy` process on loopback (through `epd-launch`, as in the pod)."""

    process: subprocess.Popen[bytes]
    port: int
    log: pathlib.Path

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as answer:
                return int(answer.status), answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def alive(self) -> bool:
        if self.process.poll() is not None:
            pytest.fail(f"the proxy exited ({self.process.returncode}):\n{self.tail()}")
        with contextlib.suppress(OSError):
            return self.get("/metrics")[0] == 200
        return False

    def metrics(self) -> dict[str, float]:
        status, text = self.get("/metrics")
        assert status == 200, text
        return prometheus_samples(text)

    def roster(self) -> dict[str, tuple[int, int]]:
        """Per role, the (healthy, unhealthy) instances of epd_proxy_roster_instances."""
        samples = self.metrics()
        return {
            role: tuple(  # type: ignore[misc]
                int(samples.get(f'epd_proxy_roster_instances{{role="{role}",state="{state}"}}', -1))
                for state in ("healthy", "unhealthy")
            )
            for role in ROLES
        }

    def backend_requests(self) -> float:
        return sum(v for k, v in self.metrics().items() if k.startswith("epd_proxy_backend_requests_total"))

    def tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _local_path(value: str, mounts: dict[str, pathlib.Path]) -> str:
    """A path inside one of the pod's mounts, moved to the folder standing in for that mount."""
    for mount in sorted(mounts, key=len, reverse=True):
        if value == mount or value.startswith(mount.rstrip("/") + "/"):
            return str(mounts[mount]) + value[len(mount) :]
    return value


def launch_as_rendered(kube: Kube, kubeconfig: pathlib.Path, ns: str, deployment: str, tmp: pathlib.Path) -> Proxy:
    """Run the proxy Deployment's container here: its command and env, its ConfigMap volumes as folders, its
    ServiceAccount's token as the only credentials. The test adds its listener, no probing and KUBECONFIG."""
    workload = kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{deployment}-{Role.PROXY}")
    pod = workload["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    account = pod["serviceAccountName"]
    assert pod.get("automountServiceAccountToken") is True, "the proxy's pod must get its account's token"

    tmp.mkdir(parents=True, exist_ok=True)
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts: dict[str, pathlib.Path] = {}
    for mount in container["volumeMounts"]:
        folder = tmp / "mounts" / mount["name"]
        folder.mkdir(parents=True, exist_ok=True)
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            data = kube.get(f"/api/v1/namespaces/{ns}/configmaps/{volume['configMap']['name']}")["data"]
            for key, text in data.items():
                (folder / key).write_text(text)
        else:
            assert "emptyDir" in volume, f"no stand-in for volume {volume}"
        mounts[mount["mountPath"]] = folder

    env = {k: v for k, v in os.environ.items() if not k.startswith(("EPD_", "KUBE"))}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = _local_path(item["value"], mounts)
        else:  # only the downward API's pod IP is used; this process's address is loopback
            assert item["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP", item
            env[item["name"]] = "127.0.0.1"
    credentials = tmp / "proxy.kubeconfig"
    token_kubeconfig(kube, kubeconfig, ns, account, credentials)
    port = free_port()
    env.update(
        {
            "KUBECONFIG": str(credentials),
            "EPD_PROXY_HOST": "127.0.0.1",
            "EPD_PROXY_PORT": str(port),
            "EPD_PROXY_PROBE_INTERVAL": "0",  # never connect to a (simulated) pod
            "EPD_PROXY_LOG_LEVEL": "info",
            "PATH": f"{pathlib.Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1",
        }
    )
    command = [_local_path(arg, mounts) for arg in [*container["command"], *(container.get("args") or [])]]
    log = tmp / "proxy.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=tmp)
    proxy = Proxy(process, port, log)
    try:
        eventually(f"the proxy answering /metrics (log: {log})", proxy.alive, PROXY_START_S, every=0.2)
    except BaseException:
        proxy.stop()
        raise
    return proxy


@contextlib.contextmanager
def proxy_of(kube: Kube, kubeconfig: pathlib.Path, ns: str, deployment: str, tmp: pathlib.Path) -> Iterator[Proxy]:
    proxy = launch_as_rendered(kube, kubeconfig, ns, deployment, tmp)
    try:
        assert "(health probing off)" in proxy.log.read_text(), "the proxy would probe the simulated pods"
        yield proxy
        assert proxy.backend_requests() == 0, "the proxy sent a request to a simulated pod"
        assert " evicted " not in proxy.log.read_text(), "the proxy probed a simulated pod"
    finally:
        proxy.stop()


def roster_is(proxy: Proxy, want: dict[str, int]) -> bool:
    got = proxy.roster()
    return all(got[role] == (n, 0) for role, n in want.items())


def counts(pods: dict[str, list[str]]) -> dict[str, int]:
    return {role: len(ips) for role, ips in pods.items()}


# -- tests


def test_the_roster_follows_the_ready_pods_without_a_restart(
    admin: Kube, slices_cluster: cluster.Cluster, served: Served, tmp_path: pathlib.Path
) -> None:
    ns, name = served.ns, served.main
    pods = ready_pods(admin, ns, name)
    assert counts(pods) == {"encoder": 2, "prefill": 2, "decode": 2}
    network = ipaddress.ip_network(POD_CIDR)
    assert all(ipaddress.ip_address(ip) in network for ips in pods.values() for ip in ips)
    # The premise: with this pod range the EndpointSlice controller publishes every Ready pod.
    sliced = {role: functools.partial(sliced_addresses, admin, ns, f"{name}-{role}") for role in ROLES}
    eventually(
        "every Service's EndpointSlices listing its Ready pods",
        lambda: all(sliced[role]() == pods[role] for role in ROLES),
        detail=lambda: f"sliced {[sliced[role]() for role in ROLES]}, Ready pods {pods}",
    )

    with proxy_of(admin, slices_cluster.kubeconfig, ns, name, tmp_path) as proxy:

        def detail() -> str:
            return f"roster {proxy.roster()}, Ready pods {counts(ready_pods(admin, ns, name))}\n{proxy.tail()}"

        eventually("the roster equal to the Ready pods", lambda: roster_is(proxy, counts(pods)), detail=detail)
        status, body = proxy.get("/health")
        assert status == 200, body
        # It watches the model pods too (the rendered Role allows it): every instance has the deployment's revision.
        revision = admin.get(EPD_PATH.format(ns=ns) + f"/{name}")["status"]["modelRevision"]
        assert revision
        eventually(
            "the proxy routing to the deployment's model revision",
            lambda: json.loads(proxy.get("/health")[1]).get("modelRevision") == revision,
            detail=lambda: f"{proxy.get('/health')[1]}\n{proxy.tail()}",
        )

        # Scaling: more decode pods, fewer encoders; the same proxy process follows.
        admin.merge_patch(
            EPD_PATH.format(ns=ns) + f"/{name}", {"spec": {"decode": {"replicas": 3}, "encoder": {"replicas": 1}}}
        )
        eventually(
            "the roster at 1 encoder and 3 decode",
            lambda: roster_is(proxy, {"encoder": 1, "prefill": 2, "decode": 3}),
            detail=detail,
        )
        assert counts(ready_pods(admin, ns, name)) == {"encoder": 1, "prefill": 2, "decode": 3}

        # A pod whose readiness fails leaves the roster, and comes back when it passes again.
        decode_ip = ready_pods(admin, ns, name)["decode"][0]
        set_pod_ready(admin, ns, decode_ip, ready=False)
        eventually("the unready decode pod out of the roster", lambda: roster_is(proxy, {"decode": 2}), detail=detail)
        assert decode_ip not in sliced_addresses(admin, ns, f"{name}-decode")
        set_pod_ready(admin, ns, decode_ip, ready=True)
        eventually("the decode pod back in the roster", lambda: roster_is(proxy, {"decode": 3}), detail=detail)

        assert proxy.process.poll() is None
        log = proxy.log.read_text()
        assert log.count("epd-proxy: listening on") == 1, "one proxy process served every change"
        assert "Forbidden" not in log and "forbidden" not in log, "the rendered Role allows all it does"


def test_without_its_rolebinding_the_proxy_is_refused_and_recovers(
    admin: Kube, slices_cluster: cluster.Cluster, served: Served, operator: Operator, tmp_path: pathlib.Path
) -> None:
    """The control for the test above: the Role is what lets the proxy watch. A refused proxy stays up and
    says why; once the binding is back it fills its roster without a restart. A running operator restores a
    deleted binding at once (test_operator_children), so it is stopped meanwhile, and its restart restores it."""
    ns, name = served.ns, served.main
    path = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings/{name}-{Role.PROXY}"
    operator.stop()
    try:
        admin.request("DELETE", path)
        with proxy_of(admin, slices_cluster.kubeconfig, ns, name, tmp_path) as proxy:
            who = f"system:serviceaccount:{ns}:{name}-{Role.PROXY}"
            eventually(
                "the proxy logging that the API server refused its account the EndpointSlices",
                lambda: any(
                    "forbidden" in line and who in line and 'cannot list resource \\"endpointslices\\"' in line
                    for line in proxy.tail(400).splitlines()
                ),
                detail=proxy.tail,
            )
            assert proxy.alive()
            status, _ = proxy.get("/health")
            assert status == 503, "no instance known: not ready"
            assert proxy.roster() == {role: (0, 0) for role in ROLES}

            operator.start()  # its resume re-applies every child, the binding among them
            eventually("the binding back", lambda: admin.find(path) is not None)
            want = counts(ready_pods(admin, ns, name))
            eventually(
                "the roster filled once the binding is back",
                lambda: roster_is(proxy, want),
                detail=lambda: f"{proxy.roster()} != {want}\n{proxy.tail()}",
            )
            assert proxy.process.poll() is None
    finally:
        if operator.process is not None and operator.process.poll() is not None:  # failed before the restart
            operator.start()


def test_every_prefill_pool_is_in_the_roster(
    admin: Kube, slices_cluster: cluster.Cluster, served: Served, tmp_path: pathlib.Path
) -> None:
    """Each prefill pool has its own Service (<deployment>-prefill-<pool>); the proxy watches every one and
    its prefill roster is their union."""
    ns, name = served.ns, served.pools
    pods = counts(ready_pods(admin, ns, name))
    assert pods == {"encoder": 2, "prefill": 3, "decode": 2}, "two prefill pools: 2 of TP 1 and 1 of TP 2"
    with proxy_of(admin, slices_cluster.kubeconfig, ns, name, tmp_path) as proxy:
        eventually(
            "every prefill pool's pods, the encoders and decode in the roster",
            lambda: roster_is(proxy, pods),
            detail=lambda: f"{proxy.roster()}, Ready pods {pods}\n{proxy.tail()}",
        )
        # Settled: a later update of one pool's Service must not drop the other's pods.
        time.sleep(SHORT_S)
        assert proxy.roster()["prefill"] == (3, 0), proxy.tail()
        assert f"{name}-prefill-tp2 1)" in proxy.log.read_text(), "the TP 2 pool's own Service is watched"
