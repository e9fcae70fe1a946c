"""The operator part of `make demo`: install the CRD, run the operator, apply the examples, wait for Ready.

Kept apart from demo.py, which only needs the cluster, so the cluster part works (and is readable) on its
own. Everything the operator contributes is found on disk or by import (crds/, examples/, the epd_operator
package), never assumed; `missing_parts` names what is absent, and the demo stops before this stage then.
The operator runs as a subprocess of the demo, listening on loopback only, and is stopped when the demo ends;
what it created stays in the cluster.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pathlib
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import yaml

from epd_testenv import cluster, layout, nodes, process

OPERATOR_MODULE = "epd_operator.main"
READY_TIMEOUT_S = 180.0
"""How long the examples get to become Ready: kwok runs pods at once, so a minute is already generous."""
LIVENESS_TIMEOUT_S = 60.0


KEDA_CRD = "keda.sh_scaledobjects.yaml"
"""KEDA's ScaledObject CRD (hack/build-k8s-tools.sh copies it from KEDA's Go module): the autoscaled example's
ScaledObjects are accepted, though no KEDA runs to act on them."""
PROMETHEUS_URL = "http://prometheus.monitoring.svc:9090"
"""What the operator names for KEDA's triggers; nothing queries it, as no KEDA runs here."""


def crd_files(root: pathlib.Path) -> list[pathlib.Path]:
    """Ours from crds/, and KEDA's ScaledObject CRD where the Go tools were built."""
    keda = layout.bin_dir() / "keda" / KEDA_CRD
    return sorted((root / "crds").glob("*.yaml")) + ([keda] if keda.exists() else [])


def example_files(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted((root / "examples").glob("*.yaml"))


def operator_available() -> bool:
    try:
        return importlib.util.find_spec(OPERATOR_MODULE) is not None
    except ModuleNotFoundError:
        return False


def missing_parts(root: pathlib.Path) -> list[str]:
    """What the operator stage needs and does not find."""
    missing = []
    if not crd_files(root):
        missing.append("the CRD (crds/*.yaml)")
    if not operator_available():
        missing.append(f"the operator ({OPERATOR_MODULE})")
    if not example_files(root):
        missing.append("sample EPDDeployments (examples/*.yaml)")
    return missing


# -- what the examples need from the cluster


def claims(doc: dict[str, Any]) -> list[str]:
    """PersistentVolumeClaims an EPDDeployment mounts: the model weights and the shared EC folder."""
    spec = doc.get("spec") or {}
    found = [((spec.get("model") or {}).get("source") or {}).get("pvc", {}).get("claimName")]
    found.append(((spec.get("sharedStorage") or {}).get("pvc") or {}).get("claimName"))
    return [c for c in found if c]


def claim_objects(namespace: str, claim: str) -> list[dict[str, Any]]:
    """A PVC pre-bound to a static PV: the demo cluster has no storage provisioner, and a pod whose claim
    is unbound never schedules. Nothing is ever mounted (kwok runs no containers); the hostPath is a formality.
    """
    pv = f"epd-demo-{namespace}-{claim}"[:63]
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv, "labels": {"epd.testenv/demo": "true"}},
            "spec": {
                "capacity": {"storage": "100Gi"},
                "accessModes": ["ReadWriteMany", "ReadOnlyMany"],
                "hostPath": {"path": f"/tmp/{pv}"},
                "claimRef": {"namespace": namespace, "name": claim},
                "storageClassName": "",
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "resources": {"requests": {"storage": "100Gi"}},
                "volumeName": pv,
                "storageClassName": "",
            },
        },
    ]


def prerequisites(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Namespaces and bound claims for every example (deduplicated, so examples may share a claim)."""
    objects: dict[tuple[str, str, str], dict[str, Any]] = {}
    for doc in docs:
        namespace = doc["metadata"].get("namespace", "default")
        objects[("Namespace", "", namespace)] = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": namespace},
        }
        for claim in claims(doc):
            for obj in claim_objects(namespace, claim):
                objects[(obj["kind"], namespace, obj["metadata"]["name"])] = obj
    return list(objects.values())


# -- running it


class Kubectl:
    """The pinned kubectl against one cluster."""

    def __init__(self, local: cluster.Cluster) -> None:
        self.env = {**os.environ, "KUBECONFIG": str(local.kubeconfig)}
        self.binary = str(layout.binary("kubectl"))

    def __call__(self, *args: str, stdin: str | None = None, capture: bool = False) -> str:
        done = subprocess.run(
            [self.binary, *args], env=self.env, input=stdin, text=True, capture_output=capture, check=True
        )
        return done.stdout if capture else ""

    def apply(self, objects: list[dict[str, Any]]) -> None:
        self("apply", "--server-side", "--field-manager=epd-demo", "-f", "-", stdin=yaml.safe_dump_all(objects))


@contextlib.contextmanager
def running_operator(local: cluster.Cluster, say: Callable[[str], None]) -> Iterator[pathlib.Path]:
    """The operator as a subprocess watching every namespace; its endpoints on free loopback ports."""
    metrics_port, liveness_port = process.free_ports(2)
    liveness = f"http://127.0.0.1:{liveness_port}/healthz"
    command = [
        sys.executable,
        "-m",
        OPERATOR_MODULE,
        "--all-namespaces",
        f"--kubeconfig={local.kubeconfig}",
        "--metrics-host=127.0.0.1",
        f"--metrics-port={metrics_port}",
        f"--liveness={liveness}",
        "--store-poll-interval=0",  # the fleet's masters are simulated pods: nothing may be sent to them
        "--transfer-poll-interval=0",  # nor to its proxies
        f"--prometheus-url={PROMETHEUS_URL}",
    ]
    log = local.files.logs / "operator.log"
    with log.open("ab") as out:
        operator = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + LIVENESS_TIMEOUT_S
        while not _answers(liveness):
            if operator.poll() is not None or time.monotonic() > deadline:
                raise cluster.ClusterError(f"the operator did not come up:\n{process.log_tail(log)}")
            time.sleep(0.2)
        say(f"operator running (log: {log})")
        yield log
    finally:
        operator.terminate()
        try:
            operator.wait(timeout=30)
        except subprocess.TimeoutExpired:
            operator.kill()
            operator.wait()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def run(local: cluster.Cluster, root: pathlib.Path, say: Callable[[str], None]) -> None:
    """Install the CRD, run the operator, apply every example, wait for Ready, show the result."""
    kubectl = Kubectl(local)
    say("installing the CRDs (ours from crds/, KEDA's ScaledObject)")
    for crd in crd_files(root):
        kubectl("apply", "--server-side", "--field-manager=epd-demo", "-f", str(crd))
    kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")

    docs = [doc for path in example_files(root) for doc in yaml.safe_load_all(path.read_text()) if doc]
    for doc in docs:
        # Off the real node, when the cluster has one: these pods are for the simulated GPU fleet.
        nodes.place_on(doc["spec"], {nodes.SIMULATED_LABEL: "true"})
    say("creating the namespaces and bound volume claims the examples mount (no provisioner here)")
    kubectl.apply(prerequisites(docs))

    with running_operator(local, say) as log:
        say(f"applying {len(docs)} example EPDDeployments from examples/")
        kubectl.apply(docs)
        for namespace in sorted({d["metadata"].get("namespace", "default") for d in docs}):
            say(f"waiting for the EPDDeployments in {namespace} to become Ready ...")
            kubectl(
                "wait",
                "--for=condition=Ready",
                "epddeployments",
                "--all",
                f"--namespace={namespace}",
                f"--timeout={READY_TIMEOUT_S:.0f}s",
            )
        kubectl("get", "epddeployments", "--all-namespaces")
        for namespace in sorted({d["metadata"].get("namespace", "default") for d in docs}):
            kubectl("get", "deployments,statefulsets,services,pods", f"--namespace={namespace}", "-o", "wide")
        show_gpu_use(kubectl, say)
    say(f"the operator stopped with the demo (its log: {log}); what it created stays in the cluster")


def show_gpu_use(kubectl: Kubectl, say: Callable[[str], None]) -> None:
    """GPUs requested on each simulated node against what it offers: the scheduler's packing, in numbers."""
    nodes_ = yaml.safe_load(kubectl("get", "nodes", "-l", f"{nodes.SIMULATED_LABEL}=true", "-o", "json", capture=True))
    pods = yaml.safe_load(kubectl("get", "pods", "--all-namespaces", "-o", "json", capture=True))
    used = {n["metadata"]["name"]: 0 for n in nodes_["items"]}
    for pod in pods["items"]:
        node = pod["spec"].get("nodeName")
        if node not in used or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for container in pod["spec"]["containers"]:
            requests = (container.get("resources") or {}).get("requests") or {}
            used[node] += int(requests.get(nodes.GPU_RESOURCE, "0"))
    offered = {n["metadata"]["name"]: n["status"]["allocatable"].get(nodes.GPU_RESOURCE, "0") for n in nodes_["items"]}
    say("GPUs requested per node: " + ", ".join(f"{n} {used[n]}/{offered[n]}" for n in sorted(used)))
