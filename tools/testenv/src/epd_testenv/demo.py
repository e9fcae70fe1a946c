"""`python -m epd_testenv.demo` (`make demo`): the local cluster, its GPU nodes, and then the operator at work.

The demo runs in stages. The first two always run: bring the cluster up (or reuse a ready one) and show the
simulated GPU nodes. The rest (demo_operator) needs the CRD in crds/, the operator package and the samples in
examples/; when one is missing the demo names it and stops there, it never pretends. Otherwise it installs the
CRD, runs the operator against the cluster, applies the examples, waits for them to become Ready and shows
what the operator created and where the scheduler put the GPUs. With --model (the tiny model's folder; `make
demo` gives it) and root, the cluster has a real node too, and the last stage (demo_realnode) serves an image
question from real containers the in-cluster operator created.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys

from epd_testenv import cli, cluster, demo_operator, demo_realnode, layout, nodehost, nodeimages, nodes, realnode

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
    """Reuse a running, ready cluster (keeping whatever was deployed into it) that has the node asked for;
    otherwise start a fresh one."""
    status = local.status()
    has_node = "kubelet" in status.running or local.settings.real_node is None
    if status.ready and not status.stopped and has_node:
        say(f"reusing the running cluster in {local.state_dir}")
        return
    local.up()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m epd_testenv.demo", description=__doc__)
    parser.add_argument("--model", type=pathlib.Path, help="the tiny model's folder: also run E+PD on the real node")
    args = parser.parse_args(argv)
    root = layout.repo_root()
    real = args.model is not None and os.geteuid() == 0
    if args.model is not None and not real:
        say("no real node: it needs root (bridges, mounts, cgroups); the simulated fleet only")
    settings = cluster.Settings(
        real_node=realnode.NodeNetwork() if real else None,
        node_images=layout.real_node_images() if real else (),
    )
    local = cluster.Cluster(root / layout.DEFAULT_CLUSTER_DIR, settings)
    try:
        ensure_cluster(local)
    except (cluster.ClusterError, nodehost.HostError, nodeimages.ImageError, FileNotFoundError) as error:
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
            if real:
                demo_realnode.run(local, root, args.model.resolve(), say)
        except (cluster.ClusterError, subprocess.CalledProcessError, RuntimeError) as error:
            print(f"demo: {error}", file=sys.stderr)
            return 1
    print(cli.usage_hint(local.kubeconfig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
