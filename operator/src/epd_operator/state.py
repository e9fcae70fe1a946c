"""What the operator knows of one EPDDeployment between reconcile passes: a value, passed into each pass and
returned by it (module reconcile), kept by the controller under the deployment's key.

A restarted operator starts from the object alone (`first_seen`): its first pass applies every child again
(no-ops for the server) and the watches' listings fill in the workloads and pods. Lost with the process is the
last valid render of a spec that is invalid now: its roles read Unknown (and its children go unrepaired) until
the spec is fixed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from epd_operator import apply, status
from epd_operator.api.resource import Owner
from epd_operator.api.status import EPDDeploymentStatus, StoreStatus, TransferStatus
from epd_operator.render import Desired
from epd_operator.world import ChildKey


@dataclass(frozen=True)
class DeploymentState:
    """One EPDDeployment as the operator knows it."""

    owner: Owner
    """The object as last acted on: its generation is the one status reports (applied, or found invalid,
    blocked or refused; a spec whose apply failed for a while still reports the previous one)."""
    status: EPDDeploymentStatus
    """As last computed (or read from the object when first seen): what the next computation starts from, so a
    condition's lastTransitionTime is when it flipped even where the write came later (module publish)."""
    written: EPDDeploymentStatus
    """As last written (or read from the object when first seen)."""
    written_at: float | None = None
    """When this process last wrote the status (monotonic seconds); None: not yet."""
    rendered_generation: int | None = None
    """The generation `candidate` and `problems` are the render of (a spec is rendered once)."""
    candidate: Desired | None = None
    """The render of `rendered_generation` when that spec is valid, applied or not yet."""
    problems: tuple[str, ...] = ()
    """Why the spec of `rendered_generation` cannot be deployed; empty when it is valid."""
    desired: Desired | None = None
    """The last render applied: what status observes and repairs restore; None until a spec was applied."""
    synced_generation: int | None = None
    """The generation whose children were applied."""
    refused_generation: int | None = None
    """A generation not to apply again: the server refused a child for good, or a name conflict stands."""
    blocked: tuple[str, str] | None = None
    """(reason, message) when the current spec's children could not be applied (status.Facts.blocked)."""
    blocking: frozenset[ChildKey] = frozenset()
    """The objects of other EPDDeployments in the way (a name conflict): their deletion retries the apply."""
    failure: str = ""
    """The message of the last failure announced, so a failure retried unchanged is announced once."""
    failed_applies: int = 0
    """Applies failed in a row (the retry waits longer after each)."""
    waiting: Mapping[ChildKey, tuple[float, dict[str, Any] | None]] = field(default_factory=dict)
    """Repairs waiting for their turn (pacing) or for a retry: when (monotonic s), and the child as last seen."""
    opened_gates: frozenset[str] = frozenset()
    """Model pods whose revision gate this process opened (a late event may still show one closed)."""
    store: StoreStatus | None = None
    """The store master's reading as last reported; None without a store or while it is not read."""
    transfers: TransferStatus | None = None
    """The proxy's canary reading as last reported; None without a proxy or while it is not read."""

    @property
    def key(self) -> tuple[str, str]:
        return self.owner.namespace, self.owner.name


def owner_of_body(body: Mapping[str, Any]) -> Owner:
    meta = body["metadata"]
    return Owner(meta["name"], meta["namespace"], meta["uid"], int(meta.get("generation") or 1))


def from_body(body: Mapping[str, Any]) -> DeploymentState:
    """A deployment seen for the first time; its readings kept from its status until the first new one, so a
    restart does not blank them."""
    written = status.parse(body.get("status"))
    return DeploymentState(owner_of_body(body), written, written, store=written.store, transfers=written.transfers)


def wanted(desired: Desired | None, key: ChildKey) -> dict[str, Any] | None:
    """The child `key` as `desired` has it; None when there is no such child."""
    if desired is None:
        return None
    return next((o for o in desired.objects if apply.key_of(o) == key), None)
