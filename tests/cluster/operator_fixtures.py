"""Fixtures for the operator's cluster tests: the CRD installed, the operator running as a subprocess, helpers.

Test modules load this with `pytest_plugins = ["tests.cluster.operator_fixtures"]`. Each module gets one
operator process (`operator`), started on loopback against the session's test cluster and watching only the
namespaces `op_namespace` creates (the "epd-op-" prefix), so other tests' objects never reach it. The operator's
log goes to a file; when a test fails, the part written during that test is printed to the terminal.

The helpers talk only to the API server and to the operator's own metrics and liveness endpoints on loopback;
no request ever goes to a simulated pod IP or a ClusterIP.

PYTEST_DONT_REWRITE: test modules import the helpers before pytest loads this module as their plugin, too late
for assertion rewriting; the marker tells pytest that is intended (plain asserts here).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client

from epd_operator.api import constants as c
from epd_testenv import layout

T = TypeVar("T")

NAMESPACE_PREFIX = "epd-op-"
"""Namespaces of these tests; the operator under test watches exactly these (a kopf glob)."""
NAMESPACE_SETTLE_S = 2.0
"""After the operator answers its liveness probe, before a test may create a namespace (see Operator.start)."""
DEADLINE_S = 60.0
"""kwok runs pods at once and the controllers react within a second or two; a minute absorbs a loaded machine."""
REPO = layout.repo_root()
CRD_FILE = REPO / "crds" / "epddeployments.yaml"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
EPD_PATH = f"/apis/{c.API_VERSION}/namespaces/{{ns}}/{c.PLURAL}"

WORKLOADS = (("apps/v1", "deployments"), ("apps/v1", "statefulsets"), ("apps/v1", "daemonsets"))
CHILD_KINDS = (
    ("v1", "configmaps"),
    ("v1", "services"),
    ("networking.k8s.io/v1", "networkpolicies"),
    ("policy/v1", "poddisruptionbudgets"),
    ("v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io/v1", "roles"),
    ("rbac.authorization.k8s.io/v1", "rolebindings"),
    *WORKLOADS,
    ("autoscaling/v2", "horizontalpodautoscalers"),
    ("keda.sh/v1alpha1", "scaledobjects"),
)
"""Every kind the operator may create (apply.MANAGED_KINDS, spelled as REST paths)."""


# -- talking to the API server


def prometheus_samples(text: str) -> dict[str, float]:
    """A Prometheus text page as 'name{labels}' -> value."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


class ApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status, self.body = status, body


class Kube:
    """Raw JSON requests through the session's kubernetes ApiClient (admin identity, loopback only)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        url = self.api.configuration.host + path
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        response = self.api.call_api(method, url, header_params=headers, body=body, _request_timeout=30)
        raw = response.read()  # type: ignore[no-untyped-call]
        try:
            decoded = json.loads(raw) if raw else {}
        except ValueError:  # "404 page not found": a kind the server does not serve
            decoded = {"message": raw[:200].decode(errors="replace")}
        if response.status >= 300:
            raise ApiError(response.status, decoded)
        return decoded

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def find(self, path: str) -> Any | None:
        try:
            return self.get(path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def items(self, path: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.get(path).get("items") or []
        return found

    def apply(self, obj: dict[str, Any], manager: str = "test-user") -> Any:
        """Server-side apply as a user would (`kubectl apply --server-side`)."""
        meta = obj["metadata"]
        plural = c.PLURAL if obj["kind"] == c.KIND else _plural(obj)
        path = _collection(obj["apiVersion"], plural, meta.get("namespace")) + f"/{meta['name']}"
        return self.request("PATCH", f"{path}?fieldManager={manager}&force=true", obj, "application/apply-patch+yaml")

    def merge_patch(self, path: str, patch: dict[str, Any]) -> Any:
        return self.request("PATCH", path, patch, "application/merge-patch+json")

    def delete(self, path: str) -> None:
        with contextlib.suppress(ApiError):
            self.request("DELETE", path, {"propagationPolicy": "Background"})

    # -- our objects

    def epd(self, ns: str, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.get(EPD_PATH.format(ns=ns) + f"/{name}")
        return found

    def children(self, ns: str, name: str, kinds: tuple[tuple[str, str], ...] = CHILD_KINDS) -> list[dict[str, Any]]:
        """Every object carrying the deployment's labels (kind filled in, as a list omits it)."""
        selector = f"{c.LABEL_DEPLOYMENT}={name},{c.LABEL_MANAGED_BY}={c.MANAGED_BY}"
        found: list[dict[str, Any]] = []
        for api_version, plural in kinds:
            listed = self.find(_collection(api_version, plural, ns) + f"?labelSelector={selector}")
            if listed is None:  # a CRD kind this cluster does not serve (KEDA's, outside the tests' clusters)
                continue
            kind = listed["kind"].removesuffix("List")
            found += [{**item, "kind": kind, "apiVersion": api_version} for item in listed.get("items") or []]
        return found


def _collection(api_version: str, plural: str, ns: str | None) -> str:
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{ns}/{plural}" if ns else f"{prefix}/{plural}"


def _plural(obj: dict[str, Any]) -> str:
    kind: str = obj["kind"].lower()
    return {"networkpolicy": "networkpolicies", "poddisruptionbudget": "poddisruptionbudgets"}.get(kind, kind + "s")


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((x for x in (obj.get("status") or {}).get("conditions") or [] if x["type"] == kind), {})


def key(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def eventually(
    what: str,
    probe: Callable[[], T | None],
    timeout: float = DEADLINE_S,
    every: float = 0.1,
    detail: Callable[[], str] | None = None,
) -> T:
    """Poll until `probe` returns something other than None or False; fail naming what never happened
    (and what `detail` says about the state it was left in)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:.0f} s: {what}" + (f"\n{detail()}" if detail else ""))
        time.sleep(every)


def settled(what: str, snapshot: Callable[[], T], quiet: float = 3.0, timeout: float = DEADLINE_S) -> T:
    """`snapshot()` once it stopped changing for `quiet` seconds (controllers finish their status updates:
    a PodDisruptionBudget's, for one, lags its pods by a moment)."""
    last, since = snapshot(), time.monotonic()
    deadline = since + timeout
    while time.monotonic() - since < quiet:
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:.0f} s: {what} settled")
        time.sleep(0.5)
        now = snapshot()
        if now != last:
            last, since = now, time.monotonic()
    return last


def example(path: pathlib.Path, namespace: str, name: str | None = None) -> dict[str, Any]:
    """An example manifest moved into the test's namespace (and renamed if asked)."""
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    doc["metadata"] = {"name": name or doc["metadata"]["name"], "namespace": namespace}
    return doc


def claims(doc: dict[str, Any]) -> list[str]:
    """PersistentVolumeClaims an example mounts (model weights, shared storage)."""
    spec = doc["spec"]
    found = [spec["model"]["source"].get("pvc", {}).get("claimName")]
    found.append((spec.get("sharedStorage") or {}).get("pvc", {}).get("claimName"))
    return [x for x in found if x]


def provide_claim(kube: Kube, ns: str, claim: str) -> None:
    """A PVC bound to a static hostPath PV, so pods mounting it schedule (the test cluster has no provisioner)."""
    pv_name = f"{ns}-{claim}"[:63]
    kube.request(
        "POST",
        "/api/v1/persistentvolumes",
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv_name, "labels": {"epd-op-test": ns}},
            "spec": {
                "capacity": {"storage": "100Gi"},
                "accessModes": ["ReadWriteMany", "ReadOnlyMany"],
                "hostPath": {"path": f"/tmp/{pv_name}"},
                "claimRef": {"namespace": ns, "name": claim},
                "persistentVolumeReclaimPolicy": "Delete",
            },
        },
    )
    kube.request(
        "POST",
        f"/api/v1/namespaces/{ns}/persistentvolumeclaims",
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "resources": {"requests": {"storage": "100Gi"}},
                "volumeName": pv_name,
                "storageClassName": "",
            },
        },
    )


# -- the operator process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Operator:
    """`epd-operator` as a subprocess on loopback; its log in a file."""

    def __init__(self, kubeconfig: pathlib.Path, log: pathlib.Path, extra: tuple[str, ...] = ()) -> None:
        self.kubeconfig, self.log, self.extra = kubeconfig, log, extra
        self.metrics_port, self.liveness_port = free_port(), free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def scope(self) -> list[str]:
        """Which namespaces the operator serves: the tests' own, by prefix."""
        return ["--namespace", f"{NAMESPACE_PREFIX}*"]

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "epd_operator.main",
            *self.scope(),
            "--kubeconfig",
            str(self.kubeconfig),
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(self.metrics_port),
            "--liveness",
            f"http://127.0.0.1:{self.liveness_port}/healthz",
            # The masters here are simulated pods: nothing may be sent to their addresses.
            "--transfer-poll-interval=0",  # the proxy is a simulated pod too
            "--store-poll-interval",
            "0",
            f"--prometheus-url={PROMETHEUS_URL}",
            *self.extra,
        ]

    def start(self, timeout: float = 30.0) -> None:
        with self.log.open("ab") as sink:
            sink.write(f"\n===== start {datetime.now(UTC).isoformat()} =====\n".encode())
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            self.process = subprocess.Popen(self.argv(), stdout=sink, stderr=subprocess.STDOUT, env=env)
        eventually(f"the operator's liveness endpoint (log: {self.log})", self.alive, timeout, every=0.2)
        # kopf (1.45) lists namespaces, then starts a watch that lists them again and ignores that second
        # listing: a namespace created between the two is never watched. Tests create theirs right after
        # this returns, so give kopf time to get past that window (it lasts milliseconds after start-up).
        time.sleep(NAMESPACE_SETTLE_S)

    def alive(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            pytest.fail(f"the operator exited:\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no cleanup, no last writes, as when a node dies."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def metrics(self) -> dict[str, float]:
        """Samples of /metrics: 'name{labels}' -> value."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as answer:
            return prometheus_samples(answer.read().decode())

    def rss_kib(self) -> int:
        """Resident memory now (VmRSS) and at its peak (VmHWM) come from /proc; this is the peak."""
        assert self.process is not None
        status = pathlib.Path(f"/proc/{self.process.pid}/status").read_text()
        match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
        return int(match.group(1)) if match else 0

    def tail(self, since: int = 0, lines: int = 120) -> str:
        with self.log.open("rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def size(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0


# -- fixtures


@pytest.fixture(scope="session")
def kube(api_client: client.ApiClient) -> Kube:
    return Kube(api_client)


PROMETHEUS_URL = "http://127.0.0.1:9"
"""The Prometheus every operator under test names for KEDA's triggers (`--prometheus-url`, as the chart's
autoscaling.prometheusUrl sets it); nothing queries it, as KEDA does not run here."""
KEDA_CRD = "keda.sh_scaledobjects.yaml"
"""KEDA's ScaledObject CRD (copied from its Go module by hack/build-k8s-tools.sh): the API server checks the
operator's ScaledObjects against KEDA's own schema. KEDA itself does not run here."""


def install_crd(kube: Kube, doc: dict[str, Any], plural_path: str) -> None:
    """Apply a CRD and wait until the API server serves its kind (a list at `plural_path` answers)."""
    name = doc["metadata"]["name"]
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
    kube.request("PATCH", f"{path}?fieldManager=epd-tests&force=true", doc, "application/apply-patch+yaml")
    eventually(f"the CRD {name} established", lambda: condition(kube.get(path), "Established").get("status") == "True")
    # The apiserver serves a new CRD's storage a moment after Established; a list proves it.
    eventually(f"the {name} API to answer", lambda: _answers(kube, plural_path))


@pytest.fixture(scope="session")
def crd(kube: Kube) -> dict[str, Any]:
    """The EPDDeployment CRD from crds/ (and KEDA's ScaledObject CRD), installed and established."""
    keda: dict[str, Any] = yaml.safe_load((layout.bin_dir() / "keda" / KEDA_CRD).read_text())
    install_crd(kube, keda, "/apis/keda.sh/v1alpha1/scaledobjects")
    doc: dict[str, Any] = yaml.safe_load(CRD_FILE.read_text())
    install_crd(kube, doc, f"/apis/{c.API_VERSION}/{c.PLURAL}")
    return doc


def _answers(kube: Kube, path: str) -> bool:
    try:
        kube.get(path)
    except ApiError:
        return False
    return True


@pytest.fixture(scope="module")
def operator(
    crd: dict[str, Any],
    kubeconfig: pathlib.Path,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Operator]:
    """One operator for the test module."""
    log = tmp_path_factory.mktemp("operator") / f"{request.module.__name__.rsplit('.', 1)[-1]}.log"
    running = Operator(kubeconfig, log)
    running.start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(autouse=True)
def _operator_log_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    """Print what the operator logged during a failed test (straight to the terminal, past capturing)."""
    if "operator" not in request.fixturenames:
        yield
        return
    running: Operator = request.getfixturevalue("operator")
    start, failed = running.size(), request.session.testsfailed
    yield
    if request.session.testsfailed > failed:
        capture = request.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            print(f"\n----- operator log during {request.node.name} ({running.log}) -----\n{running.tail(start)}")


@pytest.fixture
def op_namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace the operator watches; deleted afterwards with its pods (and any test PersistentVolumes)."""
    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:30].rstrip("-")
    name = f"{NAMESPACE_PREFIX}{stem}-{uuid.uuid4().hex[:5]}"
    kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    try:
        yield name
    finally:
        # The four simulated nodes hold 32 GPUs: free this test's at once (the namespace controller takes ~5 s):
        # the EPDDeployments (or the operator restores what we delete), the workloads (or their controllers make
        # new pods), then the pods without a grace period.
        for api_version, plural in ((c.API_VERSION, c.PLURAL), *WORKLOADS, ("apps/v1", "replicasets")):
            kube.delete(_collection(api_version, plural, name))
        with contextlib.suppress(ApiError):
            kube.request("DELETE", f"/api/v1/namespaces/{name}/pods", {"gracePeriodSeconds": 0})
        kube.delete(f"/api/v1/namespaces/{name}")
        eventually(f"the pods of {name} gone", lambda: kube.items(f"/api/v1/namespaces/{name}/pods") == [], every=0.2)
        for pv in kube.items(f"/api/v1/persistentvolumes?labelSelector=epd-op-test={name}"):
            kube.delete(f"/api/v1/persistentvolumes/{pv['metadata']['name']}")
