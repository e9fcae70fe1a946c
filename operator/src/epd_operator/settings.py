"""How one operator process is configured: command-line flags, each with an environment variable behind it.

The Helm chart sets the environment; a developer types flags; a flag wins over its variable. Everything is
parsed once into a frozen `Settings`, which `main` hands to kopf, the metrics server and the handlers.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast, get_args

from epd_connectors.config.layered import Layered
from epd_connectors.config.vllm import VllmVersion
from epd_operator._kube import Connection
from epd_operator.api.resource import OperatorDefaults, OperatorPeer

DEFAULT_LIVENESS = "http://0.0.0.0:8080/healthz"
"""kopf's liveness endpoint: it answers once the operator has connected and while it keeps watching."""
DEFAULT_METRICS_PORT = 9090
"""Prometheus /metrics; 0 disables it."""

DEFAULT_CONCURRENT_RECONCILES = 4
"""Enough to keep the API server busy; more only interleaves the requests so that every deployment finishes
late (measured: 50 deployments at once, bench/operator)."""

DEFAULT_STORE_POLL_INTERVAL_S = 15.0
"""Seconds between readings of each store master's /health and /metrics (status.store, StoreReady); 0 turns
reading off (then StoreReady counts pods alone)."""
DEFAULT_TRANSFER_POLL_INTERVAL_S = 10.0
"""Seconds between readings of each proxy's canary report (status.transfers, TransferReady); 0 turns reading
off (then TransferReady does not hold Ready back)."""
ENV_PREFIX = "EPD_OPERATOR_"


@dataclass(frozen=True)
class Settings:
    """One operator process."""

    namespaces: tuple[str, ...] = ()
    """Namespaces to watch (EPDDeployments and their workloads)."""
    all_namespaces: bool = False
    """Watch the whole cluster instead (needs cluster-wide RBAC)."""
    peering: str | None = None
    """kopf peering object name, for more than one replica (one handles, the rest stand by); None: standalone."""
    priority: int | None = None
    """This replica's rank in the peering (the highest live one handles); None: a random one (`peering_priority`)."""
    liveness: str | None = DEFAULT_LIVENESS
    """URL kopf serves its liveness probe on; None disables it."""
    metrics_host: str = "0.0.0.0"
    metrics_port: int = DEFAULT_METRICS_PORT
    defaults: OperatorDefaults = field(default_factory=OperatorDefaults)
    """Images and the GPU resource name where a spec is silent."""
    connection: Connection = field(default_factory=Connection)
    """Where the API server is."""
    concurrent_reconciles: int = DEFAULT_CONCURRENT_RECONCILES
    """Deployments applied at the same time (the rest wait their turn; status updates never wait)."""
    store_poll_interval_s: float = DEFAULT_STORE_POLL_INTERVAL_S
    """Seconds between readings of a store master; 0: never read one (an operator whose masters are simulated
    pods, or that cannot reach the pods' network)."""
    transfer_poll_interval_s: float = DEFAULT_TRANSFER_POLL_INTERVAL_S
    """Seconds between readings of a proxy's canary report; 0: never read one (as for the store)."""
    verbose: bool = False
    debug: bool = False


class SettingsError(ValueError):
    """Flags and environment do not make a runnable configuration."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="epd-operator",
        description="Run the EPDDeployment operator. Every flag also reads EPD_OPERATOR_<FLAG> (e.g. "
        "EPD_OPERATOR_NAMESPACES=a,b, EPD_OPERATOR_VLLM_IMAGE); a flag wins over its variable.",
    )
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", default=None, help="watch every namespace")
    p.add_argument("--peering", help="kopf peering name for several replicas (default: standalone, no peering)")
    p.add_argument("--priority", type=int, help="this replica's peering priority (default: a random one)")
    p.add_argument("--liveness", help=f"liveness endpoint URL, '' to disable (default {DEFAULT_LIVENESS})")
    p.add_argument("--metrics-host", help="address of the metrics server (default 0.0.0.0)")
    p.add_argument(
        "--metrics-port", type=int, help=f"port of the metrics server, 0 to disable ({DEFAULT_METRICS_PORT})"
    )
    defaults = OperatorDefaults()
    p.add_argument("--vllm-image", help=f"default encoder/prefill/decode image ({defaults.vllm_image})")
    p.add_argument("--proxy-image", help=f"default proxy image ({defaults.proxy_image})")
    p.add_argument("--mooncake-image", help=f"default master and store-client image ({defaults.mooncake_image})")
    p.add_argument("--gpu-resource", help=f"extended resource name of a GPU ({defaults.gpu_resource})")
    p.add_argument(
        "--vllm-version", choices=get_args(VllmVersion), help=f"the default image's vLLM ({defaults.vllm_version})"
    )
    p.add_argument("--prometheus-url", help="the Prometheus KEDA's triggers query for autoscaled roles (default: none)")
    p.add_argument(
        "--concurrent-reconciles",
        type=int,
        help=f"deployments applied at the same time ({DEFAULT_CONCURRENT_RECONCILES})",
    )
    p.add_argument(
        "--store-poll-interval",
        type=float,
        help=f"seconds between readings of each store master, 0 to never read one ({DEFAULT_STORE_POLL_INTERVAL_S:g})",
    )
    p.add_argument(
        "--transfer-poll-interval",
        type=float,
        help="seconds between readings of each proxy's canary report, 0 to never read one "
        f"({DEFAULT_TRANSFER_POLL_INTERVAL_S:g})",
    )
    p.add_argument(
        "--pod-namespace",
        help="the operator's own namespace in the cluster: stores' NetworkPolicies admit it to the master's metrics "
        "port (with --pod-labels)",
    )
    p.add_argument("--pod-labels", help="the operator pods' labels, k=v,k=v (with --pod-namespace)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    p.add_argument("--context", help="kubeconfig context (default: its current-context)")
    p.add_argument("-v", "--verbose", action="store_true", default=None, help="log more")
    p.add_argument("--debug", action="store_true", default=None, help="log every API call kopf makes")
    return p


def parse(argv: Sequence[str] | None, environ: Mapping[str, str]) -> Settings:
    """Settings from flags over environment; SettingsError when no watch scope is given."""
    args = parser().parse_args(argv)
    given = Layered(args, environ, ENV_PREFIX)
    # A scope given by flags replaces the environment's.
    scope = given if not (args.namespace or args.all_namespaces) else Layered(args, {}, ENV_PREFIX)
    namespaces = tuple(scope.items("namespace", str, env="NAMESPACES"))
    all_namespaces = scope.switch("all_namespaces")
    if not namespaces and not all_namespaces:
        raise SettingsError("give --namespace NS (repeatable) or --all-namespaces (or EPD_OPERATOR_NAMESPACES)")
    if namespaces and all_namespaces:
        raise SettingsError("give either namespaces or all namespaces, not both")
    base = OperatorDefaults()
    return Settings(
        namespaces=namespaces,
        all_namespaces=all_namespaces,
        peering=given.value("peering", None, str) or None,
        priority=given.value("priority", None, int),
        liveness=given.value("liveness", DEFAULT_LIVENESS, str) or None,
        metrics_host=given.value("metrics_host", "0.0.0.0", str) or "0.0.0.0",
        metrics_port=given.value("metrics_port", DEFAULT_METRICS_PORT, int),
        defaults=OperatorDefaults(
            vllm_image=given.value("vllm_image", base.vllm_image, str) or base.vllm_image,
            proxy_image=given.value("proxy_image", base.proxy_image, str) or base.proxy_image,
            mooncake_image=given.value("mooncake_image", base.mooncake_image, str) or base.mooncake_image,
            gpu_resource=given.value("gpu_resource", base.gpu_resource, str) or base.gpu_resource,
            vllm_version=given.value("vllm_version", base.vllm_version, _vllm_version),
            prometheus_url=given.value("prometheus_url", "", str) or None,
            operator_peer=_operator_peer(given.value("pod_namespace", "", str), given.value("pod_labels", "", str)),
        ),
        store_poll_interval_s=max(0.0, given.value("store_poll_interval", DEFAULT_STORE_POLL_INTERVAL_S, float)),
        transfer_poll_interval_s=max(
            0.0, given.value("transfer_poll_interval", DEFAULT_TRANSFER_POLL_INTERVAL_S, float)
        ),
        concurrent_reconciles=max(1, given.value("concurrent_reconciles", DEFAULT_CONCURRENT_RECONCILES, int)),
        connection=Connection(kubeconfig=args.kubeconfig or environ.get("KUBECONFIG"), context=args.context),
        verbose=given.switch("verbose"),
        debug=given.switch("debug"),
    )


def _vllm_version(value: str) -> VllmVersion:
    """EPD_OPERATOR_VLLM_VERSION (the flag is checked by argparse's choices)."""
    known = get_args(VllmVersion)
    if value not in known:
        raise SettingsError(f"vLLM version {value!r} is not one of {', '.join(known)}")
    return cast(VllmVersion, value)


def _operator_peer(namespace: str, labels: str) -> OperatorPeer | None:
    """Where the operator's own pods are, for the stores' NetworkPolicies; None outside a cluster."""
    if not namespace and not labels:
        return None
    pairs = [item.partition("=") for item in labels.split(",") if item.strip()]
    if not namespace or not pairs or any(not key.strip() or not sep for key, sep, _ in pairs):
        raise SettingsError("give --pod-namespace NS and --pod-labels k=v,k=v together (the chart sets both)")
    return OperatorPeer(namespace, tuple((key.strip(), value.strip()) for key, _, value in pairs))
