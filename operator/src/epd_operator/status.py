"""The EPDDeployment status, computed from what the children report (pure; `calls.write_status` writes it).

`observe` reads one workload's replica counts, `compute` turns the
observations, the spec's validity and the derived values into the whole status (per-role counts, the
"ready/desired" strings kubectl's columns show, conditions, phase). A condition keeps its lastTransitionTime
unless its status flips, so recomputing an unchanged world gives an equal status, and the caller writes only
when the result differs from what is already there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from epd_connectors.config.roles import Role
from epd_operator import autoscalers
from epd_operator.api import constants as c
from epd_operator.api.status import (
    Condition,
    DeploymentValues,
    EPDDeploymentStatus,
    Phase,
    RoleStatus,
    StoreStatus,
    TransferStatus,
)
from epd_operator.render import Derived, RoleWorkload
from epd_operator.transfer_health import verdict

ConditionStatus = Literal["True", "False", "Unknown"]

STATUS_KEYS: dict[str, str] = {Role.STORE_CLIENT: "storeClients"}
"""status.roles keys that differ from the role label (camelCase, as everywhere in the API)."""

ROLE_CONDITIONS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (c.COND_STORE_READY, (Role.MASTER, Role.STORE_CLIENT), "no spec.store: this deployment uses no store"),
    (c.COND_ENCODERS_READY, (Role.ENCODER,), "no encoders"),
    (c.COND_PREFILL_READY, (Role.PREFILL,), "no spec.prefill: decode runs combined prefill+decode (PD)"),
    (c.COND_DECODE_READY, (Role.DECODE, Role.PD), "no decode"),
    (c.COND_PROXY_READY, (Role.PROXY,), "no proxy"),
)
"""Each role condition, the roles it covers, and its message when the spec has none of them."""

ROLES_READY_KEYS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (Role.ENCODER, (Role.ENCODER,)),
    (Role.PREFILL, (Role.PREFILL,)),
    (Role.DECODE, (Role.DECODE,)),
    (Role.PD, (Role.PD,)),
    ("store", (Role.MASTER, Role.STORE_CLIENT)),
    (Role.PROXY, (Role.PROXY,)),
)
"""status.rolesReady keys (read by the CRD's printer columns) and the roles each one sums."""

# Reasons, one CamelCase word each.
REASON_VALID = "SpecValid"
REASON_INVALID = "InvalidSpec"
REASON_NOT_REQUIRED = "NotRequired"
REASON_MISSING = "WorkloadMissing"
REASON_ROLLING = "RollingOut"
REASON_NOT_READY = "PodsNotReady"
REASON_READY = "AllReplicasReady"
REASON_ALL_READY = "AllRolesReady"
REASON_ROLES_NOT_READY = "RolesNotReady"
REASON_NAME_CONFLICT = "NameConflict"
"""Another EPDDeployment controls an object of a name this one's children need (apply.conflicts)."""
REASON_APPLY_FAILED = "ApplyFailed"
"""The API server refused a child (its message follows)."""
REASON_MASTER_UNREACHABLE = "MasterUnreachable"
"""The store's pods are ready, but the master does not answer the operator or does not serve."""
REASON_NO_CAPACITY = "NoStoreCapacity"
"""The master serves, but no segment is mounted: every put would fail."""
REASON_SINGLE_REPLICA = "SingleReplica"
"""Redundant is False: a serving role runs one replica."""
REASON_REPLICATED = "Replicated"
"""Redundant is True: every serving role runs two or more."""
PROGRESS_REASONS = frozenset({REASON_MISSING, REASON_ROLLING})
"""Reasons that mean "on its way", not "broken"."""


def now() -> str:
    """The current time as Kubernetes writes it (RFC 3339, seconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Observed:
    """One workload as its controller reports it."""

    workload: RoleWorkload
    found: bool
    """The object exists (and is not being deleted)."""
    desired: int
    ready: int
    updated: int
    """Replicas running the current pod template."""
    current: int
    """Pods that exist, old and new (more than desired while a rollout replaces them)."""
    settled: bool
    """The controller has acted on the latest spec (status.observedGeneration >= metadata.generation)."""

    @property
    def state(self) -> tuple[bool, str, str]:
        """(ready, reason, message) of this workload."""
        what = f"{self.workload.kind} {self.workload.name}"
        if not self.found:
            return False, REASON_MISSING, f"{what} does not exist yet"
        if not self.settled or self.updated < self.desired or self.current > self.desired:
            return False, REASON_ROLLING, f"{what}: {self.updated}/{self.desired} updated"
        needed = self.desired if self.workload.ready_needed is None else min(self.workload.ready_needed, self.desired)
        if self.workload.autoscaled:  # pods its autoscaler is adding are not a role going unready
            needed = min(max(self.workload.bounds[0], 1), self.desired)
        leading = " (only the leader is Ready; standbys wait)" if self.workload.ready_needed is not None else ""
        if self.ready < needed:
            return False, REASON_NOT_READY, f"{what}: {self.ready}/{self.desired} ready{leading}"
        return True, REASON_READY, f"{what}: {self.ready}/{self.desired} ready{leading}"


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


def observe(workload: RoleWorkload, live: dict[str, Any] | None) -> Observed:
    """Read the replica counts of a Deployment, StatefulSet or DaemonSet (None: not found)."""
    if live is None or live.get("metadata", {}).get("deletionTimestamp"):
        return Observed(workload, False, workload.replicas or 0, 0, 0, 0, False)
    st: dict[str, Any] = live.get("status") or {}
    settled = _int(st.get("observedGeneration")) >= _int(live["metadata"].get("generation"))
    if workload.kind == "DaemonSet":
        desired = _int(st.get("desiredNumberScheduled"))
        return Observed(
            workload,
            True,
            desired,
            _int(st.get("numberReady")),
            _int(st.get("updatedNumberScheduled")),
            _int(st.get("currentNumberScheduled")),
            settled,
        )
    spec_replicas = (live.get("spec") or {}).get("replicas", 1)
    desired = workload.replicas if workload.replicas is not None else _int(spec_replicas)
    return Observed(
        workload,
        True,
        desired,
        _int(st.get("readyReplicas")),
        _int(st.get("updatedReplicas")),
        _int(st.get("replicas")),
        settled,
    )


@dataclass(frozen=True)
class Facts:
    """Everything `compute` needs."""

    generation: int
    """metadata.generation of the EPDDeployment."""
    problems: Sequence[str]
    """Why the current spec cannot be deployed; empty when it is valid."""
    observed: Sequence[Observed] | None
    """The workloads of the last valid render, observed; None when no spec was ever valid."""
    derived: Derived | None
    """Derived values of the last valid render."""
    previous: EPDDeploymentStatus
    """The status as it stands (for lastTransitionTime and the Degraded phase)."""
    now: str
    blocked: tuple[str, str] | None = None
    """(reason, message) when the valid spec of `generation` could not be applied: a name conflict, or a child
    the API server refused. The generation still counts as observed (the operator acted on it, and Ready says
    why it failed); `observed` is then the last render that was applied, if any."""
    store: StoreStatus | None = None
    """The master's last report (store_health); None without a store or while the operator does not read it,
    and then StoreReady counts pods alone."""
    transfers: TransferStatus | None = None
    """The proxy's canary report (transfer_health); None while the operator does not read it, and then
    TransferReady does not hold Ready back."""
    autoscalers: Sequence[autoscalers.Reading] = ()
    """The autoscaled workloads of the last applied render and their autoscalers as last seen."""


def condition(
    previous: EPDDeploymentStatus, kind: str, status: ConditionStatus, *, reason: str, message: str, facts: Facts
) -> Condition:
    """A condition; lastTransitionTime is the previous one's when the status did not flip."""
    before = next((x for x in previous.conditions if x.type == kind), None)
    since = before.last_transition_time if before is not None and before.status == status else facts.now
    return Condition(
        type=kind,
        status=status,
        reason=reason,
        message=message,
        observed_generation=facts.generation,
        last_transition_time=since,
    )


def _sum(observed: Sequence[Observed], roles: Sequence[str]) -> RoleStatus | None:
    mine = [o for o in observed if o.workload.role in roles]
    if not mine:
        return None
    return RoleStatus(
        desired=sum(o.desired for o in mine),
        ready=sum(o.ready for o in mine),
        updated=sum(o.updated for o in mine),
        current=sum(o.current for o in mine),
    )


def _nothing_applied(facts: Facts) -> tuple[str, str]:
    """The reason and message of a condition about the children while none were applied."""
    if facts.blocked is not None and not facts.problems:
        return facts.blocked[0], "nothing was applied yet: see Ready"
    return REASON_INVALID, "no valid spec was applied yet"


def _role_condition(
    facts: Facts, observed: Sequence[Observed] | None, kind: str, roles: Sequence[str], absent: str
) -> Condition:
    if observed is None:
        reason, message = _nothing_applied(facts)
        return condition(facts.previous, kind, "Unknown", reason=reason, message=message, facts=facts)
    mine = [o for o in observed if o.workload.role in roles]
    if not mine:
        return condition(facts.previous, kind, "True", reason=REASON_NOT_REQUIRED, message=absent, facts=facts)
    states = [o.state for o in mine]
    failing = [s for s in states if not s[0]]
    if not failing:
        return condition(
            facts.previous, kind, "True", reason=REASON_READY, message="; ".join(s[2] for s in states), facts=facts
        )
    # The most telling reason: a missing workload, then a rollout, then unready pods.
    order = (REASON_MISSING, REASON_ROLLING, REASON_NOT_READY)
    reason = min((s[1] for s in failing), key=order.index)
    return condition(
        facts.previous, kind, "False", reason=reason, message="; ".join(s[2] for s in failing), facts=facts
    )


SERVING_ROLES: tuple[tuple[Role, str], ...] = (
    (Role.ENCODER, "media requests"),
    (Role.PREFILL, "serving"),
    (Role.DECODE, "serving"),
    (Role.PD, "serving"),
    (Role.PROXY, "serving"),
)
"""The roles a request passes through, and what losing the only pod of one stops."""


def _redundancy_condition(facts: Facts, observed: Sequence[Observed] | None) -> Condition:
    """Whether one pod loss can stop serving: a role that runs exactly one replica (over its pools) is named."""
    if observed is None:
        reason, message = _nothing_applied(facts)
        return condition(facts.previous, c.COND_REDUNDANT, "Unknown", reason=reason, message=message, facts=facts)
    single = []
    for role, stops in SERVING_ROLES:
        if sum(o.desired for o in observed if o.workload.role == role) == 1:  # an autoscaler's count as it is now
            single.append(f"{role.value} has one replica: losing its pod stops {stops} until a new one is ready")
    if single:
        message = "; ".join(single)
        return condition(
            facts.previous, c.COND_REDUNDANT, "False", reason=REASON_SINGLE_REPLICA, message=message, facts=facts
        )
    message = "every serving role runs two or more replicas"
    return condition(facts.previous, c.COND_REDUNDANT, "True", reason=REASON_REPLICATED, message=message, facts=facts)


def _with_store(facts: Facts, pods: Condition) -> Condition:
    """StoreReady with the master's own report: ready pods are not enough when the master does not serve or
    the pool has no memory."""
    store = facts.store
    if store is None or pods.status != "True" or pods.reason == REASON_NOT_REQUIRED:
        return pods
    if not store.reachable:
        message = (
            f"{pods.message}; but the master does not answer the operator: {store.message}. Check the master's "
            "log, and that the operator reaches its metrics port (the chart admits the operator's pods)"
        )
        return condition(
            facts.previous, pods.type, "False", reason=REASON_MASTER_UNREACHABLE, message=message, facts=facts
        )
    if store.capacity_bytes <= 0:
        message = (
            f"{pods.message}; but no segment is mounted at the master, so every put fails: the pods that hold "
            "the pool (store clients, or vLLM ranks in embedded mode) have not registered; see their logs"
        )
        return condition(facts.previous, pods.type, "False", reason=REASON_NO_CAPACITY, message=message, facts=facts)
    return pods


def _transfer_condition(facts: Facts) -> Condition:
    """TransferReady: the proxy's canaries over every path it routes."""
    derived = facts.derived
    if derived is None:
        return condition(
            facts.previous,
            c.COND_TRANSFER_READY,
            "Unknown",
            reason=REASON_INVALID,
            message="no valid spec",
            facts=facts,
        )
    if derived.proxy_health_url is None:
        message = "no canaries: no proxy, or spec.proxy.transferCheck.enabled is false"
        reason = REASON_NOT_REQUIRED
    elif facts.transfers is None:
        message, reason = "the operator does not read the proxy's canaries (--transfer-poll-interval 0)", "NotRead"
    else:
        status, reason, message = verdict(facts.transfers)
        return condition(facts.previous, c.COND_TRANSFER_READY, status, reason=reason, message=message, facts=facts)
    return condition(facts.previous, c.COND_TRANSFER_READY, "True", reason=reason, message=message, facts=facts)


def _phase(facts: Facts, conditions: Sequence[Condition], ready_total: int) -> Phase:
    by_type = {x.type: x for x in conditions}
    if by_type[c.COND_VALID].status != "True":
        return "Invalid"
    if by_type[c.COND_READY].status == "True":
        return "Ready"
    if facts.blocked is not None:  # the spec is not what runs: whatever runs is the previous one
        return "Degraded" if ready_total > 0 else "Pending"
    rolling = any(x.reason in PROGRESS_REASONS for x in conditions)
    was_ready = facts.previous.phase in ("Ready", "Degraded") and facts.previous.observed_generation == facts.generation
    if was_ready and not rolling:
        return "Degraded"
    return "Progressing" if ready_total > 0 or facts.previous.phase != "Pending" else "Pending"


def compute(facts: Facts) -> EPDDeploymentStatus:
    """The whole status from the facts (pure)."""
    prev, observed = facts.previous, facts.observed
    if facts.problems:
        valid = condition(
            prev, c.COND_VALID, "False", reason=REASON_INVALID, message="; ".join(facts.problems), facts=facts
        )
    else:
        valid = condition(prev, c.COND_VALID, "True", reason=REASON_VALID, message="the spec is valid", facts=facts)
    role_conditions = [_role_condition(facts, observed, kind, roles, absent) for kind, roles, absent in ROLE_CONDITIONS]
    role_conditions = [_with_store(facts, x) if x.type == c.COND_STORE_READY else x for x in role_conditions]
    transfer = _transfer_condition(facts)
    required = facts.derived is not None and facts.derived.transfers_required
    waited_for = [*role_conditions, transfer] if required else role_conditions
    if facts.problems:
        message = "fix the spec (see Valid); " + (
            "the children still follow the last valid spec" if observed is not None else "nothing was created"
        )
        ready = condition(prev, c.COND_READY, "False", reason=REASON_INVALID, message=message, facts=facts)
    elif facts.blocked is not None:
        reason, message = facts.blocked
        if observed is not None:
            message += "; the children still follow the last spec applied"
        ready = condition(prev, c.COND_READY, "False", reason=reason, message=message, facts=facts)
    elif all(x.status == "True" for x in waited_for):
        ready = condition(
            prev, c.COND_READY, "True", reason=REASON_ALL_READY, message="every role is ready", facts=facts
        )
    else:
        waiting = "; ".join(f"{x.type}: {x.message}" for x in waited_for if x.status != "True")
        ready = condition(prev, c.COND_READY, "False", reason=REASON_ROLES_NOT_READY, message=waiting, facts=facts)
    scaling = autoscalers.condition(facts.autoscalers)
    conditions = [
        valid,
        *role_conditions,
        transfer,
        ready,
        _redundancy_condition(facts, observed),
        condition(prev, c.COND_AUTOSCALING, scaling[0], reason=scaling[1], message=scaling[2], facts=facts),
    ]

    roles: dict[str, RoleStatus] = {}
    roles_ready: dict[str, str] = {}
    if observed is not None:
        for role in dict.fromkeys(o.workload.role for o in observed):
            summed = _sum(observed, (role,))
            if summed is not None:
                roles[STATUS_KEYS.get(role, role)] = summed
        for key, covered in ROLES_READY_KEYS:
            summed = _sum(observed, covered)
            if summed is not None:
                roles_ready[key] = f"{summed.ready}/{summed.desired}"
    # The derived values as the last render made them (kept from before while no spec was ever valid here).
    values: DeploymentValues = facts.derived if facts.derived is not None else prev
    ready_total = sum(r.ready for r in roles.values())
    return EPDDeploymentStatus(
        **{name: getattr(values, name) for name in DeploymentValues.model_fields},
        observed_generation=facts.generation,
        phase=_phase(facts, conditions, ready_total),
        roles=roles,
        roles_ready=roles_ready,
        store=facts.store,
        transfers=facts.transfers,
        conditions=conditions,
    )


def flips(previous: EPDDeploymentStatus, current: EPDDeploymentStatus) -> list[Condition]:
    """Conditions whose status changed (or appeared), for Events."""
    before = {x.type: x.status for x in previous.conditions}
    return [x for x in current.conditions if before.get(x.type) != x.status]


def urgent(written: EPDDeploymentStatus, new: EPDDeploymentStatus) -> bool:
    """Whether `new` must replace `written` at once: the first status, a new generation, Ready flipped or with a
    new reason (a conflict gone, an apply refused), or a condition that held and no longer does. Anything else is
    progress (counts, messages, a role coming up)."""
    if not written.conditions or new.observed_generation != written.observed_generation:
        return True
    before = {x.type: x for x in written.conditions}
    for x in new.conditions:
        old = before.get(x.type)
        if old is None or (old.status == "True" and x.status != "True"):
            return True
        if x.type == c.COND_READY and (old.status, old.reason) != (x.status, x.reason):
            return True
    return False


def parse(raw: dict[str, Any] | None) -> EPDDeploymentStatus:
    """The status as stored on the object; an empty one when absent or unreadable (we then rewrite it)."""
    try:
        return EPDDeploymentStatus.model_validate(raw or {})
    except ValueError:
        return EPDDeploymentStatus()


def to_json(status: EPDDeploymentStatus) -> dict[str, Any]:
    return status.model_dump(by_alias=True, mode="json")
