"""`python -m epd_testenv.demo` (`make demo`): the local cluster, its GPU nodes, and then the operator at work.

The demo runs in stages. The first two always run: bring the cluster up (or reuse a ready one) and show the
simulated GPU nodes. The rest needs the operator, which is built in later milestones: the CRD in crds/, an
operator entry point (`python -m epd_operator`) and sample EPDDeployments in examples/. Until all three exist
the demo says which are missing and stops there; it never pretends. Once they exist the same code installs the
CRD, runs the operator against the cluster, applies the examples and shows what the operator created.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys
import time

from epd_testenv import cli, cluster, layout, nodes, process

_ZONE_PATH = nodes.ZONE_LABEL.replace(".", "\\.")  # kubectl's column paths need the dots in keys escaped
NODE_COLUMNS = ",".join(
    (
        "NAME:.metadata.name",
        f"ZONE:.metadata.labels.{_ZONE_PATH}",
        "GPU:.status.capacity.nvidia\\.com/gpu",
        "GPU-ALLOCATABLE:.status.allocatable.nvidia\\.com/gpu",
        "CPU:.status.capacity.cpu",
        "MEMORY:.status.capacity.memory",
        "PODS:.status.capacity.pods",
        "READY:.status.conditions[?(@.type=='Ready')].status",
    )
)

OPERATOR_SETTLE_S = 15.0
"""How long the operator gets to act on the examples before the demo shows the result."""


def say(line: str) -> None:
    print(f"demo: {line}", flush=True)


def kubectl(local: cluster.Cluster, *args: str) -> None:
    """Run the pinned kubectl against the demo cluster, its output going straight to the terminal."""
    env = {**os.environ, "KUBECONFIG": str(local.kubeconfig)}
    subprocess.run([str(layout.binary("kubectl")), *args], env=env, check=True)


def ensure_cluster(local: cluster.Cluster) -> None:
    """Reuse a running, ready cluster (keeping whatever was deployed into it); otherwise start a fresh one."""
    status = local.status()
    if status.ready and not status.stopped:
        say(f"reusing the running cluster in {local.state_dir}")
        return
    local.up()


# -- the operator stages: each part is found on disk or in the environment, never assumed ------------------


def crd_files(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted((root / "crds").glob("*.yaml"))


def example_files(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted((root / "examples").glob("*.yaml"))


def operator_command() -> list[str] | None:
    """How to run the operator: `python -m epd_operator`, once the operator package provides that entry point."""
    try:
        found = importlib.util.find_spec("epd_operator.__main__") is not None
    except ModuleNotFoundError:
        found = False
    return [sys.executable, "-m", "epd_operator"] if found else None


def missing_operator_parts(root: pathlib.Path) -> list[str]:
    missing = []
    if not crd_files(root):
        missing.append("the CRD (crds/*.yaml)")
    if operator_command() is None:
        missing.append("the operator entry point (python -m epd_operator)")
    if not example_files(root):
        missing.append("sample EPDDeployments (examples/*.yaml)")
    return missing


def run_operator_stages(local: cluster.Cluster, root: pathlib.Path, command: list[str]) -> None:
    """Install the CRD, run the operator, apply the examples, show the result, stop the operator."""
    say("installing the CRD from crds/")
    for crd in crd_files(root):
        kubectl(local, "apply", "--server-side", "-f", str(crd))
    kubectl(local, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")

    say("starting the operator (log in the cluster's logs folder)")
    env = {**os.environ, "KUBECONFIG": str(local.kubeconfig)}
    log = local.files.logs / "operator.log"
    with log.open("ab") as out:
        operator = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        say("applying examples/")
        for example in example_files(root):
            kubectl(local, "apply", "--server-side", "-f", str(example))
        time.sleep(OPERATOR_SETTLE_S)
        if operator.poll() is not None:
            raise cluster.ClusterError(f"the operator exited:\n{process.log_tail(log)}")
        kubectl(local, "get", "epddeployments,deployments,statefulsets,services,pods", "--all-namespaces")
    finally:
        operator.terminate()
        operator.wait(timeout=30)
    say(f"operator stopped; the cluster keeps running. Operator log: {log}")


def main() -> int:
    root = layout.repo_root()
    local = cluster.Cluster(root / layout.DEFAULT_CLUSTER_DIR)
    try:
        ensure_cluster(local)
    except (cluster.ClusterError, FileNotFoundError) as error:
        print(f"demo: {error}", file=sys.stderr)
        return 1

    say("the simulated GPU nodes (kwok keeps them Ready; pods on them are simulated, never run):")
    kubectl(local, "get", "nodes", "-o", f"custom-columns={NODE_COLUMNS}")

    missing = missing_operator_parts(root)
    command = operator_command()
    if missing or command is None:
        say("the demo stops here until the operator exists; missing: " + "; ".join(missing) + ".")
    else:
        try:
            run_operator_stages(local, root, command)
        except (cluster.ClusterError, subprocess.CalledProcessError) as error:
            print(f"demo: {error}", file=sys.stderr)
            return 1
    print(cli.usage_hint(local.kubeconfig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
