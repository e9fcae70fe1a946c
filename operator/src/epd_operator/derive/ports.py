"""The ports of every container, named, and the check that none collide inside a pod.

Pods have their own network namespace, so the same port on two pods never collides; inside one pod, vLLM's
HTTP server, the EC consumer's control ports (one per TP rank) and MooncakeConnector's bootstrap server must
all differ. Listing them here (and as named container ports) also documents what a NetworkPolicy must admit.
"""

from __future__ import annotations

from typing import Final

from epd_connectors.config.ec_transfer import DEFAULT_EC_PORT, ec_consumer_ports
from epd_connectors.config.kv_transfer import DEFAULT_BOOTSTRAP_PORT
from epd_connectors.config.store_client import DEFAULT_HTTP_PORT
from epd_operator.api.store import MasterSpec, StoreClientsSpec

VLLM_HTTP_PORT: Final = 8000
"""vLLM's OpenAI server, also /health and /metrics (vLLM's default port)."""
PROXY_PORT: Final = 8000
"""The proxy's listener in its container; the Service maps spec.proxy.service.port onto it."""
EC_CONTROL_PORT: Final = DEFAULT_EC_PORT
"""Base of an EC consumer's control ports (vLLM's default ec_port); TP rank r listens on base + r."""
KV_BOOTSTRAP_PORT: Final = DEFAULT_BOOTSTRAP_PORT
"""MooncakeConnector's bootstrap server (VLLM_MOONCAKE_BOOTSTRAP_PORT); one instance per pod, so one value."""
STORE_CLIENT_METRICS_PORT: Final = DEFAULT_HTTP_PORT
"""mooncake_client's HTTP server (health and metrics), Mooncake's default."""

HTTP: Final = "http"
METRICS: Final = "metrics"
RPC: Final = "rpc"
METADATA: Final = "metadata"
BOOTSTRAP: Final = "kv-bootstrap"


def ec_port_name(rank: int) -> str:
    """Container port names are at most 15 characters; "ec-ctl-<rank>" fits any realistic TP."""
    return f"ec-ctl-{rank}"


def vllm_ports(*, tensor_parallel_size: int, ec_consumer: bool, kv_bootstrap: bool) -> dict[str, int]:
    """A vLLM pod's listeners by name. Data parallelism is 1 per pod (replicas scale out), so the EC control
    ports are base .. base + tp - 1."""
    ports = {HTTP: VLLM_HTTP_PORT}
    if ec_consumer:
        for rank, port in enumerate(ec_consumer_ports(EC_CONTROL_PORT, tensor_parallel_size, 1)):
            ports[ec_port_name(rank)] = port
    if kv_bootstrap:
        ports[BOOTSTRAP] = KV_BOOTSTRAP_PORT
    return ports


def master_ports(master: MasterSpec) -> dict[str, int]:
    """The master's listeners: RPC, metrics/health, and the optional HTTP metadata server."""
    ports = {RPC: master.rpc_port, METRICS: master.metrics_port}
    if master.http_metadata_server:
        ports[METADATA] = master.http_metadata_port
    return ports


def store_client_ports(clients: StoreClientsSpec) -> dict[str, int]:
    """A store client's listeners: its RPC port and its HTTP server (metrics for scraping)."""
    return {RPC: clients.port, METRICS: STORE_CLIENT_METRICS_PORT}


def collisions(ports: dict[str, int], field: str) -> list[str]:
    """One message per port number used twice in a pod, naming the spec field to change."""
    by_port: dict[int, list[str]] = {}
    for name, port in ports.items():
        by_port.setdefault(port, []).append(name)
    return [
        f"{field} = {port}: used by {' and '.join(names)} in the same pod. Fix: choose another port"
        for port, names in sorted(by_port.items())
        if len(names) > 1
    ]
