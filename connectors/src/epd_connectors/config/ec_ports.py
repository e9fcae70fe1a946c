"""Where an ECMooncakeConnector consumer listens: one control port per TP rank and DP replica.

vLLM 0.33 (``ec_connector/mooncake/config.py`` and ``worker.py``): TP rank r of DP replica d binds
``ec_ip:ec_port + d*tp + r``. The operator needs these to avoid port collisions in a pod, the proxy to give an
encoder the address of the consumer replica it pushes to; both read the layout from here.
"""

from __future__ import annotations

from epd_connectors.config.base import address


def ec_consumer_ports(ec_port: int, tensor_parallel_size: int, data_parallel_size: int = 1) -> list[int]:
    """Control ports of a consumer, DP replica major: TP rank r of replica d listens on ec_port + d*tp + r."""
    if tensor_parallel_size < 1 or data_parallel_size < 1:
        raise ValueError(
            f"tensor_parallel_size, data_parallel_size = {tensor_parallel_size}, {data_parallel_size}: "
            "must be at least 1. Fix: give the consumer's real parallel sizes"
        )
    return [
        ec_port + d * tensor_parallel_size + r for d in range(data_parallel_size) for r in range(tensor_parallel_size)
    ]


def ec_control_address(host: str, ec_port: int, tensor_parallel_size: int, data_parallel_index: int = 0) -> str:
    """The address an encoder pushes to for one DP replica of a consumer (its ``consumer_zmq``): TP rank 0 of
    the replica, which advertises the replica's other TP ranks."""
    return address("tcp", host, ec_port + data_parallel_index * tensor_parallel_size)
