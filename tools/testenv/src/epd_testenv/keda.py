"""KEDA beside a cluster with a real node, and the Prometheus it queries: what a cluster's autoscaling needs.

KEDA's operator and its external-metrics API server run as processes of this machine (like the control plane),
built from KEDA's Go module. The cluster's own HPA controller asks the apiserver for external metrics; the
apiserver's aggregation layer forwards that to the metrics server through the `v1beta1.external.metrics.k8s.io`
APIService, whose Service has one endpoint: this machine's address on the harness's bridge, where the metrics
server listens. The rest listen on loopback, but for the metrics server's own /metrics, which KEDA binds on
every address (its --port takes no address); nothing connects to it. Prometheus (the built binary) scrapes only
the targets a test names in its file (a `kubectl port-forward` on loopback), with the labels the chart's
PodMonitor would give them, so the operator's rendered queries select them as they would in a real cluster.

Both run as the cluster's admin, as kwok and CoreDNS do here, rather than under KEDA's RBAC objects.
"""

from __future__ import annotations

import base64
import json
import pathlib
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import yaml

from epd_testenv import api, layout, pki, process, realnode

NAMESPACE = "keda"
METRICS_SERVER = "keda-metrics-apiserver"
API_SERVICE = "v1beta1.external.metrics.k8s.io"
START_TIMEOUT_S = 120.0
"""Until the APIService is Available (KEDA's processes start in a few seconds; the aggregator checks every 30 s
at worst after a failure)."""
SCRAPE_INTERVAL = "1s"


@dataclass
class Prometheus:
    """The built prometheus on loopback, scraping what `scrape` names (file-based targets, re-read at once)."""

    workdir: pathlib.Path
    port: int = 0
    running: list[process.Running] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def _targets(self) -> pathlib.Path:
        return self.workdir / "targets.json"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.port,) = process.free_ports(1)
        self._targets.write_text("[]")
        config = {
            "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
            "scrape_configs": [{"job_name": "epd", "file_sd_configs": [{"files": [str(self._targets)]}]}],
        }
        (self.workdir / "prometheus.yaml").write_text(yaml.safe_dump(config))
        argv = [
            str(layout.binary("prometheus")),
            f"--config.file={self.workdir / 'prometheus.yaml'}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        self.running.append(process.start("prometheus", argv, self.workdir))
        _wait(lambda: self._get("/-/ready") is not None, "Prometheus ready", 60, self.running)

    def scrape(self, targets: dict[str, dict[str, str]]) -> None:
        """Scrape these HOST:PORT targets (and no others), each with its labels."""
        groups = [{"targets": [target], "labels": labels} for target, labels in targets.items()]
        tmp = self._targets.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.replace(self._targets)

    def query(self, promql: str) -> list[dict[str, Any]]:
        found = self._get("/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        return list(json.loads(found)["data"]["result"]) if found else []

    def _get(self, path: str) -> str | None:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as answer:
                return str(answer.read().decode())
        except OSError:
            return None

    def stop(self) -> None:
        process.stop(self.running, self.workdir)
        self.running.clear()


@dataclass
class Keda:
    """KEDA's operator and metrics server for one cluster (its admin kubeconfig and CA)."""

    workdir: pathlib.Path
    kubeconfig: pathlib.Path
    cluster_pki: pki.Pki
    network: realnode.NodeNetwork
    running: list[process.Running] = field(default_factory=list)

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        grpc_port, operator_metrics, operator_probes, server_port, server_metrics = process.free_ports(5)
        certs = self._certificates()
        env = {"WATCH_NAMESPACE": "", "POD_NAMESPACE": NAMESPACE, "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE}
        client = self._client()
        client.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        self._install_crds(client)
        operator = [
            str(layout.binary("keda-operator")),
            f"--kubeconfig={self.kubeconfig}",
            f"--metrics-bind-address=127.0.0.1:{operator_metrics}",
            f"--health-probe-bind-address=127.0.0.1:{operator_probes}",
            f"--metrics-service-bind-address=127.0.0.1:{grpc_port}",
            f"--cert-dir={certs}",
            f"--ca-dir={certs}",
            "--enable-cert-rotation=false",
            "--zap-log-level=info",
        ]
        self.running.append(process.start("keda-operator", operator, self.workdir, env))
        metrics_server = [
            str(layout.binary("keda-adapter")),
            f"--kubeconfig={self.kubeconfig}",
            f"--lister-kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            f"--bind-address={self.network.gateway}",
            f"--secure-port={server_port}",
            f"--cert-dir={certs}",
            f"--tls-cert-file={certs / 'tls.crt'}",
            f"--tls-private-key-file={certs / 'tls.key'}",
            f"--metrics-service-address=127.0.0.1:{grpc_port}",
            f"--port={server_metrics}",
            "--zap-log-level=info",
        ]
        self.running.append(process.start("keda-metrics-server", metrics_server, self.workdir, env))
        for path, body in _api_service_objects(self.network.gateway, server_port, self.cluster_pki.ca_cert):
            client.create(path, body)
        _wait(lambda: self._available(client), f"APIService {API_SERVICE} Available", START_TIMEOUT_S, self.running)

    @staticmethod
    def _install_crds(client: api.Client) -> None:
        """KEDA's CRDs from its module (hack/build-k8s-tools.sh copies them), established before the operator
        starts: it watches every kind once, at start."""
        path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        names = []
        for crd in sorted((layout.bin_dir() / "keda").glob("*.yaml")):
            body = yaml.safe_load(crd.read_text())
            client.create(path, body)
            names.append(body["metadata"]["name"])

        def established() -> bool:
            return all(_condition_true(client.get(f"{path}/{name}"), "Established") for name in names)

        _wait(established, "KEDA's CRDs established", 30, [])

    def _certificates(self) -> pathlib.Path:
        """ca.crt, tls.crt and tls.key, the names KEDA reads from --cert-dir: one pair for the metrics server's
        serving port (checked by the aggregator against the Service's name) and the mutual TLS of its gRPC link
        to the operator on loopback."""
        certs = self.workdir / "certs"
        certs.mkdir(exist_ok=True)
        names = (f"{METRICS_SERVER}.{NAMESPACE}.svc", "localhost")
        cert, key = pki.issue(self.cluster_pki, "keda", names, ("127.0.0.1", self.network.gateway))
        for source, name in ((self.cluster_pki.ca_cert, "ca.crt"), (cert, "tls.crt"), (key, "tls.key")):
            (certs / name).write_bytes(source.read_bytes())
        return certs

    def _client(self) -> api.Client:
        server = yaml.safe_load(self.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        address = urlsplit(server)
        assert address.hostname is not None and address.port is not None, server
        return api.Client(address.hostname, address.port, self.cluster_pki)

    @staticmethod
    def _available(client: api.Client) -> bool:
        return _condition_true(client.get(f"/apis/apiregistration.k8s.io/v1/apiservices/{API_SERVICE}"), "Available")

    def stop(self) -> None:
        """Stops both processes; the objects go with the cluster."""
        process.stop(self.running, self.workdir)
        self.running.clear()


def _api_service_objects(address: str, port: int, ca_cert: pathlib.Path) -> list[tuple[str, dict[str, Any]]]:
    """The metrics server's Service (no selector), its one endpoint at ADDRESS:PORT, and the APIService."""
    service_port = {"name": "https", "port": 443, "protocol": "TCP"}
    service = {"metadata": {"name": METRICS_SERVER}, "spec": {"ports": [service_port]}}
    endpoints = {
        "metadata": {
            "name": METRICS_SERVER,
            "labels": {
                "kubernetes.io/service-name": METRICS_SERVER,
                "endpointslice.kubernetes.io/managed-by": "epd-testenv",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }
    api_service = {
        "metadata": {"name": API_SERVICE},
        "spec": {
            "service": {"name": METRICS_SERVER, "namespace": NAMESPACE, "port": 443},
            "group": "external.metrics.k8s.io",
            "version": "v1beta1",
            "caBundle": base64.b64encode(ca_cert.read_bytes()).decode(),
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
        },
    }
    return [
        (f"/api/v1/namespaces/{NAMESPACE}/services", service),
        (f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices", endpoints),
        ("/apis/apiregistration.k8s.io/v1/apiservices", api_service),
    ]


def _condition_true(obj: dict[str, Any], kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in obj.get("status", {}).get("conditions", []))


def _wait(ready: Callable[[], bool], what: str, timeout_s: float, running: list[process.Running]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in running:
            if not process.is_ours(p.pid, p.log.parent):
                raise RuntimeError(f"{p.name} exited:\n{process.log_tail(p.log, 30)}")
        try:
            if ready():
                return
        except (api.ApiError, urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    tails = "\n".join(f"--- {p.name}\n{process.log_tail(p.log, 20)}" for p in running)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f} s\n{tails}")
