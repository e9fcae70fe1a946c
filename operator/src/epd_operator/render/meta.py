"""Labels, metadata and the bundle-hash annotation every child carries.

One place builds metadata so that every object has the owner reference (garbage collection on delete), the
recommended labels, and our role/deployment labels that the NetworkPolicy, the PDBs and status select on.
"""

from __future__ import annotations

import hashlib
from typing import Any

from epd_operator.api import constants as c
from epd_operator.api.resource import Owner

BUNDLE_HASH_LEN = 16
"""Hex digits of the bundle hash on a pod template: enough to tell versions apart, short enough to read."""


def selector_labels(owner: Owner, role: str, pool: str | None = None) -> dict[str, str]:
    """The immutable selector of a role's workload (and its Service and PDB): deployment, role, prefill pool."""
    labels = {c.LABEL_DEPLOYMENT: owner.name, c.LABEL_ROLE: str(role)}  # a Role as plain text, for every dumper
    if pool is not None:
        labels[c.LABEL_POOL] = pool
    return labels


def labels(owner: Owner, role: str, pool: str | None = None) -> dict[str, str]:
    """Recommended labels plus the selector labels."""
    return {
        c.LABEL_NAME: c.APP_NAME,
        c.LABEL_INSTANCE: owner.name,
        c.LABEL_COMPONENT: str(role),
        c.LABEL_PART_OF: c.APP_NAME,
        c.LABEL_MANAGED_BY: c.MANAGED_BY,
        **selector_labels(owner, role, pool),
    }


def metadata(owner: Owner, name: str, role: str, pool: str | None = None) -> dict[str, Any]:
    """A child's metadata: name, namespace, labels and the controller owner reference."""
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner, role, pool),
        "ownerReferences": [owner.owner_reference()],
    }


def bundle_hash(bundle_json: str) -> str:
    """The pod-template annotation value: changes exactly when the role's bundle does."""
    return hashlib.sha256(bundle_json.encode()).hexdigest()[:BUNDLE_HASH_LEN]
