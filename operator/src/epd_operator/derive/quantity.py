"""Kubernetes memory quantities: read what a user wrote, and raise it to a floor.

Kubernetes reads "4G" as 4*10**9 and "4Gi" as 4*2**30, unlike Mooncake and epd_connectors' sizes (every unit a
power of 1024); a resource list is read by the kubelet, so here Kubernetes' own rules apply.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Final

GI: Final = 1024**3
STORE_CLIENT_OVERHEAD: Final = 1 * GI
"""Memory a store client needs beyond its segment and buffer: the process, the transfer engine's metadata and
queues, and page tables for the pinned pool. Without it the pod is OOM-killed as the pool fills."""

_SUFFIX = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+)?([a-zA-Z]*)$")


def memory_bytes(quantity: str | int) -> int | None:
    """Bytes of a memory quantity, rounded up (as the kubelet does); None when it is not a quantity."""
    if isinstance(quantity, int):
        return quantity
    match = _QUANTITY.match(quantity.strip())
    if not match or match.group(3) not in _SUFFIX or (match.group(2) and match.group(3)):
        return None
    try:
        number = Decimal(match.group(1) + (match.group(2) or ""))
    except InvalidOperation:
        return None
    scaled = number * _SUFFIX[match.group(3)]
    return int(scaled.to_integral_value(rounding="ROUND_CEILING"))


def format_memory(n: int) -> str:
    """The exact binary spelling Kubernetes users read ("5Gi"), else plain bytes."""
    for unit in ("Ti", "Gi", "Mi", "Ki"):
        if n % _SUFFIX[unit] == 0:
            return f"{n // _SUFFIX[unit]}{unit}"
    return str(n)


def at_least(quantity: str | int | None, floor: int) -> str | int:
    """The user's quantity when it is at least `floor` bytes (kept as written, so a reader recognises it),
    otherwise the floor."""
    if quantity is not None:
        have = memory_bytes(quantity)
        if have is not None and have >= floor:
            return quantity
    return format_memory(floor)
