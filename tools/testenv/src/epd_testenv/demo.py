"""`python -m epd_testenv.demo` (`make demo`): the local cluster, its GPU nodes, and then the operator at work.

The demo runs in stages. The first two always run: bring the cluster up (or reuse a ready one) and show the
simulated GPU nodes. The rest (demo_operator) needs the CRD in crds/, the operator package and the samples in
examples/; when one is missing the demo names it and stops there, it never pretends. Otherwise it installs the
CRD, runs the operator against the cluster, applies the examples, waits for them to become Ready and shows
what the operator created and where the scheduler put the GPUs.
"""

from __future__ import annotations

import subprocess
import sys

from epd_testenv import cli, cluster, demo_operator, layout, nodes

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


def say(line: str) -> None:
    print(f"demo: {line}", flush=True)


def ensure_cluster(local: cluster.Cluster) -> None:
    """Reuse a running, ready cluster (keeping whatever was deployed into it); otherwise start a fresh one."""
    status = local.status()
    if status.ready and not status.stopped:
        say(f"reusing the running cluster in {local.state_dir}")
        return
    local.up()


def main() -> int:
    root = layout.repo_root()
    local = cluster.Cluster(root / layout.DEFAULT_CLUSTER_DIR)
    try:
        ensure_cluster(local)
    except (cluster.ClusterError, FileNotFoundError) as error:
        print(f"demo: {error}", file=sys.stderr)
        return 1

    say("the simulated GPU nodes (kwok keeps them Ready; pods on them are simulated, never run):")
    demo_operator.Kubectl(local)("get", "nodes", "-o", f"custom-columns={NODE_COLUMNS}")

    missing = demo_operator.missing_parts(root)
    if missing:
        say("the demo stops here until the operator exists; missing: " + "; ".join(missing) + ".")
    else:
        try:
            demo_operator.run(local, root, say)
        except (cluster.ClusterError, subprocess.CalledProcessError) as error:
            print(f"demo: {error}", file=sys.stderr)
            return 1
    print(cli.usage_hint(local.kubeconfig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
