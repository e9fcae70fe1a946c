"""Kubernetes memory quantities: read what a user wrote, and raise it to a floor.

Kubernetes reads "4G" as 4*10**9 and "4Gi" as 4*2**30, unlike Mooncake and epd_connectors' sizes (every unit a
power of 1024); a resource list is read by the kubelet, so here Kubernetes' own rules apply.
"""

from __future__ import annotations

from typing import Final

from epd_operator.api.kube import quantity_value

GI: Final = 1024**3
STORE_CLIENT_OVERHEAD: Final = 1 * GI
"""Memory a store client needs beyond its segment and buffer: the process, the transfer engine's metadata and
queues, and page tables for the pinned pool. Without it the pod is OOM-killed as the pool fills."""


def memory_bytes(quantity: str | int) -> int | None:
    """Bytes of a memory quantity, rounded up (as the kubelet does); None when it is not a quantity (the API
    models refuse those, by Kubernetes' own grammar in api.kube)."""
    value = quantity_value(quantity)
    return None if value is None else int(value.to_integral_value(rounding="ROUND_CEILING"))


def format_memory(n: int) -> str:
    """The exact binary spelling Kubernetes users read ("5Gi"), else plain bytes."""
    for unit, factor in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n % factor == 0:
            return f"{n // factor}{unit}"
    return str(n)


def at_least(quantity: str | int | None, floor: int) -> str | int:
    """The user's quantity when it is at least `floor` bytes (kept as written, so a reader recognises it),
    otherwise the floor."""
    if quantity is not None:
        have = memory_bytes(quantity)
        if have is not None and have >= floor:
            return quantity
    return format_memory(floor)


def default_requests(
    requests: dict[str, str | int], defaults: dict[str, str | int], limits: dict[str, str | int]
) -> dict[str, str | int]:
    """The user's requests, or the operator's defaults without the resources the user limited: Kubernetes then
    requests the limit, where a default above a lower limit would make the pod invalid."""
    if requests:
        return dict(requests)
    return {name: value for name, value in defaults.items() if name not in limits}
