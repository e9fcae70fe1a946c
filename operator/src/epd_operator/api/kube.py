"""Kubernetes' own limits and grammars for what a spec field ends up as: a count, a name, a label, a quantity.

A spec the CRD admits must render into objects the API server accepts, so every field that lands in a child
object is held to the child's rule here (as a JSON-schema bound or pattern, mirrored in Python), not found out
at apply time. The patterns are RE2- and Rust-regex-safe (no look-around): the API server and pydantic both
run them.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Final

from epd_connectors.config.roles import Role

INT32_MAX: Final = 2**31 - 1
"""replicas, maxSurge and every count the workloads carry are int32 in the API; JSON admits int64."""
REPLICAS_MAX: Final = 1000
"""Instances of one role: far above any GPU fleet, far below int32 (2^40 would wrap to 0 replicas)."""
TENSOR_PARALLEL_MAX: Final = 64
"""GPUs of one instance (one pod, so one node); each rank also takes a container port."""
SIZE_MAX: Final = 2**50
"""Bytes of any store size (1 PiB): beyond any node's RAM or disk, inside Mooncake's uint64 and int64 quantities."""
MAP_MAX: Final = 64
"""Entries of an env, nodeSelector or resource map (bounds the CEL cost estimate of rules over them)."""
POOLS_MAX: Final = 8
"""Additional prefill pools (bounds the CEL cost estimate of the name rule)."""
STRING_MAX: Final = 1024
"""Images, model names, paths, arguments: bounded so CEL rules over them have a finite cost."""

# -- object names (derive.names builds them; tests/unit/operator/test_crd.py renders a deployment at these limits)

SERVICE_NAME_MAX: Final = 63
"""A Service name is a DNS-1035 label."""
STATEFULSET_NAME_MAX: Final = 52
"""A StatefulSet's name plus "-<10-char revision hash>" must fit a 63-character label value."""
NAME_MAX: Final = STATEFULSET_NAME_MAX - len(f"-{Role.STORE_CLIENT}")
"""The longest EPDDeployment name: its store-client StatefulSet "<name>-store-client" is the binding limit."""
POOL_NAME_MAX: Final = SERVICE_NAME_MAX - NAME_MAX - len(f"-{Role.PREFILL}-")
"""The longest prefill pool name: "<name>-prefill-<pool>" stays a Service name at NAME_MAX, so the one limit
on metadata.name is NAME_MAX whatever the pools."""
DNS_1035: Final = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
POOL_NAME: Final = r"^[a-z][a-z0-9]*$"
"""One hyphen-free token: "<name>-prefill-<pool>" then never equals another deployment's child name."""
RESERVED_POOL_NAMES: Final = (
    "master",
    "store",
    "encoder",
    "prefill",
    "decode",
    "pd",
    "proxy",
    "bundle",
    "main",
    "client",
)
"""Words of child names (roles, "store-client", "-bundle") and the main pool's label: a pool with one of these
names would give a child name another child, or another deployment, already has."""

# -- labels, annotations, env (apimachinery validation)

DNS_1123_SUBDOMAIN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_QUALIFIED_NAME_PART = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY: Final = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?" + _QUALIFIED_NAME_PART + "$"
"""A label key: an optional DNS-subdomain prefix (at most 253) and "/", then a name of at most 63."""
LABEL_VALUE: Final = r"^(" + _QUALIFIED_NAME_PART + ")?$"
"""A label value: empty, or at most 63 of [A-Za-z0-9-_.] starting and ending alphanumeric."""
ENV_NAME: Final = r"^[A-Za-z_][A-Za-z0-9_]*$"
"""An environment variable name every shell and exec can pass on (a C identifier)."""
IMAGE: Final = r"^[^\s]+$"
"""An image reference: the kubelet refuses surrounding whitespace, and a reference has none inside."""

# -- resource quantities (k8s.io/apimachinery/pkg/api/resource, without the sign: resources are non-negative)

QUANTITY: Final = r"^[+]?([0-9]+([.][0-9]*)?|[.][0-9]+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
"""A quantity as Kubernetes parses it: "4Gi", "500m", "1.5", "1e9" (decimal k M G T P E, binary Ki ... Ei,
milli m). "4 GB" and "4GB" are not quantities."""
QUANTITY_MAX_LENGTH: Final = 40
"""Kubernetes keeps at most 18 significant digits; a longer spelling is a typo."""
STANDARD_RESOURCES: Final = ("cpu", "memory", "ephemeral-storage")
EXTENDED_RESOURCE: Final = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/" + _QUALIFIED_NAME_PART + "$"
)
"""A device plugin's resource, e.g. nvidia.com/gpu: requested in whole units, requests equal to limits."""

_QUANTITY_RE: Final = re.compile(QUANTITY)
_SUFFIX: Final = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def quantity_value(quantity: str | int) -> Decimal | None:
    """The value of a non-negative Kubernetes quantity (an int, "4Gi", "500m", "1e9"); None when it is not one."""
    if isinstance(quantity, bool):
        return None
    if isinstance(quantity, int):
        return Decimal(quantity) if quantity >= 0 else None
    if len(quantity) > QUANTITY_MAX_LENGTH or not _QUANTITY_RE.match(quantity):
        return None
    number = quantity.lstrip("+")
    suffix = number.lstrip("0123456789.")
    if suffix[:1] in ("e", "E"):
        return Decimal(number)
    return Decimal(number[: len(number) - len(suffix)]) * _SUFFIX[suffix]
