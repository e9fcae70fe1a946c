"""`python -m epd_testenv.cli up|down|status|preload-images`: the developer's handle on the local cluster.

`make cluster-up` / `make cluster-down` call it. The cluster keeps running after `up` returns; its state,
logs and kubeconfig live in one folder (default .run/cluster).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from epd_testenv import cluster, components, layout, nodehost, nodeimages, realnode

PRELOAD_DIR = pathlib.Path(".run/preload-images")
"""The state folder of preload-images' containerd (its config, socket and log)."""


def usage_hint(kubeconfig: pathlib.Path) -> str:
    """How to talk to the cluster, printed after `up`."""
    kubectl = layout.bin_dir() / "kubectl"
    return (
        f"kubeconfig: {kubeconfig}\n"
        "use it with:\n"
        f"  export KUBECONFIG={kubeconfig}\n"
        f"  {kubectl} get nodes   # kubectl and helm are in {layout.bin_dir()} (on PATH under make)\n"
        "stop it with: make cluster-down"
    )


def _state_dir(raw: str | None) -> pathlib.Path:
    return pathlib.Path(raw) if raw else layout.repo_root() / layout.DEFAULT_CLUSTER_DIR


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m epd_testenv.cli", description=__doc__)
    parser.add_argument(
        "command",
        choices=["up", "down", "status", "preload-images"],
        help="preload-images: copy the real node's images into its containerd now, with no cluster (root)",
    )
    parser.add_argument("--state-dir", help=f"cluster state folder (default: <repo>/{layout.DEFAULT_CLUSTER_DIR})")
    parser.add_argument(
        "--timeout", type=float, default=cluster.DEFAULT_READY_TIMEOUT_S, help="bring-up deadline in seconds"
    )
    parser.add_argument(
        "--pod-cidr",
        default=components.Network.pod_cidr,
        help="pod IP range (default loopback; see epd_testenv.components.Network)",
    )
    parser.add_argument(
        "--real-node",
        action="store_true",
        help="also start a real node (containerd, kubelet, kube-proxy, CoreDNS) on a bridge in 198.18.0.0/15; root",
    )
    parser.add_argument(
        "--node-image",
        action="append",
        default=[],
        metavar="TAG",
        help="a built image (images.txt tag) to copy into the real node's containerd; repeatable",
    )
    args = parser.parse_args(argv)
    settings = cluster.Settings(
        network=components.Network(pod_cidr=args.pod_cidr),
        ready_timeout_s=args.timeout,
        real_node=realnode.NodeNetwork() if args.real_node else None,
        node_images=tuple(args.node_image),
    )
    if args.command == "preload-images":
        state_dir = pathlib.Path(args.state_dir) if args.state_dir else layout.repo_root() / PRELOAD_DIR
        try:
            nodeimages.preload(state_dir, args.node_image or layout.real_node_images(), print)
        except (nodeimages.ImageError, OSError) as error:
            print(f"preload-images: {error}", file=sys.stderr)
            return 1
        return 0
    local = cluster.Cluster(_state_dir(args.state_dir), settings)

    if args.command == "up":
        try:
            local.up()
        except (cluster.ClusterError, nodehost.HostError, FileNotFoundError) as error:
            print(f"cluster: {error}", file=sys.stderr)
            return 1
        print(usage_hint(local.kubeconfig))
    elif args.command == "down":
        local.down()
    else:
        status = local.status()
        if not status.running and not status.stopped:
            print(f"cluster: not running ({local.state_dir})")
            return 3
        print(f"cluster: {local.state_dir}")
        print(f"  server:  {status.server} ({'ready' if status.ready else 'NOT ready'})")
        print(f"  running: {', '.join(status.running) or '-'}")
        if status.stopped:
            print(f"  exited:  {', '.join(status.stopped)} (logs in {local.files.logs})")
        print(f"  kubeconfig: {local.kubeconfig}")
        return 0 if status.ready and not status.stopped else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
