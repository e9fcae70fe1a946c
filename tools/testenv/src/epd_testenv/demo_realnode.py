"""The real-node part of `make demo`: the operator installed by its chart, the tiny E+PD on real containers, and
one image question answered through `kubectl port-forward`.

After the simulated GPU fleet (demo_operator), `helm upgrade --install` puts the operator into the cluster from
its built image, watching only the demo's namespace, and the E+PD example goes there with realdeploy's changes
(CPU vLLM image, the tiny model as a hostPath, everything on the real node). The demo prints the answer and
what served it: the pods, their node and images, and the proxy's own counters. A second `make demo` finds it
all running and only asks again.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import time
import urllib.request
from collections.abc import Callable

from epd_local import sample
from epd_operator.render.pod import RUN_AS_USER
from epd_testenv import cluster, demo_operator, layout, portforward, realdeploy, realnode

NAMESPACE = "epd-real"
NAME = "tiny-e-pd"
RELEASE = "epd-real"
OPERATOR_NAMESPACE = "epd-system"
EXAMPLE = "local-e-pd.yaml"
READY_TIMEOUT_S = 900.0
"""Two vLLM pods load the model on a 2-core machine in about a minute and a half; a busy one takes longer."""
POD_COLUMNS = (
    "NAME:.metadata.name,NODE:.spec.nodeName,IMAGE:.spec.containers[0].image,READY:.status.containerStatuses[0].ready"
)


def helm(local: cluster.Cluster, *args: str) -> None:
    env = layout.helm_env(local.kubeconfig, local.state_dir / "helm")
    subprocess.run([str(layout.binary("helm")), *args], env=env, check=True, stdout=subprocess.DEVNULL)


def run(local: cluster.Cluster, root: pathlib.Path, model: pathlib.Path, say: Callable[[str], None]) -> None:
    kubectl = demo_operator.Kubectl(local)
    say(f"the real node {realnode.NODE_NAME}: containerd, kubelet, kube-proxy and CoreDNS on this machine")
    kubectl("get", "node", realnode.NODE_NAME, "-o", "wide")
    kubectl.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}])
    say(f"helm upgrade --install {RELEASE} charts/epd-operator (the operator image, watching {NAMESPACE})")
    label = realnode.REAL_NODE_LABEL.replace(".", "\\.")
    helm(
        local, "upgrade", "--install", RELEASE, str(root / "charts" / "epd-operator"),
        "--namespace", OPERATOR_NAMESPACE, "--create-namespace",
        "--set", f"watchNamespaces={{{NAMESPACE}}}", "--set-string", f"nodeSelector.{label}=true",
        "--wait", "--timeout", "180s",
    )  # fmt: skip
    shared = local.state_dir / "real-node-shared"
    shared.mkdir(parents=True, exist_ok=True)
    os.chown(shared, RUN_AS_USER, RUN_AS_USER)
    site = realdeploy.RealNodeSite(vllm_image=layout.real_node_images()[-1], model_dir=model, shared_dir=shared)
    _, manifest = realdeploy.manifest(root / "examples" / EXAMPLE, site, name=NAME, namespace=NAMESPACE)
    say(f"applying examples/{EXAMPLE} as {NAMESPACE}/{NAME} on the real node (CPU vLLM image, the tiny model)")
    kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
    wait_ready(kubectl, say)
    kubectl("get", "pods", "-n", NAMESPACE, "-o", f"custom-columns={POD_COLUMNS}")
    ask(local, kubectl, say)


def wait_ready(kubectl: demo_operator.Kubectl, say: Callable[[str], None]) -> None:
    began, last = time.monotonic(), ""
    while True:
        status = json.loads(kubectl("get", "epd", "-n", NAMESPACE, NAME, "-o", "json", capture=True)).get("status", {})
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))
        if ready:
            say(f"{NAMESPACE}/{NAME} Ready after {time.monotonic() - began:.0f} s")
            return
        line = f"roles ready: {status.get('rolesReady') or '-'}"
        if line != last:
            say(f"  {time.monotonic() - began:4.0f} s  {line} (vLLM loads the model in each pod)")
            last = line
        if time.monotonic() - began > READY_TIMEOUT_S:
            raise cluster.ClusterError(f"{NAMESPACE}/{NAME} not Ready after {READY_TIMEOUT_S:.0f} s")
        time.sleep(5)


def ask(local: cluster.Cluster, kubectl: demo_operator.Kubectl, say: Callable[[str], None]) -> None:
    argv = [str(layout.binary("kubectl")), f"--kubeconfig={local.kubeconfig}"]
    with portforward.port_forward(argv, NAMESPACE, f"svc/{NAME}-proxy", 8000) as url:
        say(f"kubectl port-forward svc/{NAME}-proxy: {url}; asking an image question ...")
        began = time.monotonic()
        answer = sample.ask(url, sample.chat_body("tiny-qwen2-vl"))
        took = time.monotonic() - began
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
            metrics = response.read().decode()
    served = [
        line
        for line in metrics.splitlines()
        if line.startswith(("epd_proxy_backend_requests_total", "epd_proxy_media_items_total"))
    ]
    say(f"answer ({took:.1f} s; random weights, so the words mean nothing): {sample.answer_text(answer)!r}")
    say("served by real containers: the proxy sent the image to the encoder and a reference to the PD:")
    for line in served:
        say(f"  {line}")
