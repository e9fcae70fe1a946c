"""Who the proxy can send to: the instances of each role, their health and their load.

The roster is the one mutable piece of routing state. Static configuration fills it once; Kubernetes discovery
replaces a role's members whenever its EndpointSlices change, keeping the state (health, outstanding requests,
cached engine ids) of the instances that stay; the health prober evicts and re-admits. Routing reads
`candidates()`, which are plain values for the pure functions in `routing`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from epd_connectors.config.roles import Role
from epd_connectors.proxy.routing import Candidate


@dataclass(frozen=True)
class InstanceSpec:
    """How to reach one instance, as configuration or discovery gives it."""

    url: str
    """Base URL of its OpenAI server (http://host:port)."""
    ec_addresses: tuple[str, ...] = ()
    """EC consumers with a push connector: the control address of each data-parallel replica."""
    bootstrap_url: str | None = None
    """Prefill with MooncakeConnector: http://host:VLLM_MOONCAKE_BOOTSTRAP_PORT."""
    name: str = ""
    """The pod's name where discovery knows it (reports name pods, not only addresses)."""


@dataclass(frozen=True)
class PodRevision:
    """A model pod's revision label and when the pod was made (discovery's pod watch)."""

    revision: str
    created: str
    """creationTimestamp (RFC 3339 in UTC, so it sorts as time)."""


@dataclass
class Instance:
    """One instance and what the proxy has learned about it."""

    role: Role
    spec: InstanceSpec
    healthy: bool = False
    outstanding: int = 0
    failures: int = 0
    """Consecutive failed probes."""
    failing_since: float | None = None
    """When the first of those failed (monotonic clock); None while probes answer."""
    successes: int = 0
    """Consecutive good probes."""
    engine_id: str | None = None
    """MooncakeConnector engine id from the bootstrap server, cached until the instance leaves."""
    dp_counter: int = 0

    @property
    def url(self) -> str:
        return self.spec.url

    def candidate(self) -> Candidate:
        return Candidate(self.spec.url, self.healthy, self.outstanding)


@dataclass
class Roster:
    """Every role's instances; `roles` are the roles this deployment has (each one is required)."""

    roles: frozenset[Role]
    optional: frozenset[Role] = frozenset()
    """Roles that may have no instance at all (encoders scaled to zero): readiness and the choice of a whole
    revision set do not wait for them."""
    members: dict[Role, dict[str, Instance]] = field(default_factory=dict)
    version: int = 0
    """Bumped on every membership change (the prober and metrics look at it)."""
    failing: frozenset[tuple[str, str]] = frozenset()
    """(sender, receiver) URLs of the transfer paths whose canaries fail (module canary): an encoder whose
    pushes do not reach an EC consumer, a prefill whose KV does not reach a decode. Routing keeps such pairs
    apart; empty (the usual case) costs requests one truth test."""
    revisions: Mapping[str, PodRevision] = field(default_factory=dict)
    """Pod name -> its model revision (discovery's pod watch; change it through `set_revisions`). Routing pairs
    only instances of one revision, so an embedding or KV block made with other weights never meets a model that
    would misread it; empty (a static roster, or no pod seen) leaves routing as it is."""
    _by_revision: _RevisionIndex | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def build(
        cls,
        specs: Mapping[Role, Sequence[InstanceSpec]],
        *,
        healthy: bool = False,
        optional: frozenset[Role] = frozenset(),
    ) -> Roster:
        """A roster of the roles that have a list (possibly empty, for discovery to fill)."""
        roster = cls(frozenset(specs), optional & frozenset(specs))
        for role, role_specs in specs.items():
            roster.replace(role, role_specs, healthy=healthy)
        return roster

    @property
    def split(self) -> bool:
        """True for a prefill/decode split, False for combined PD instances."""
        return Role.PREFILL in self.roles

    @property
    def consumer_role(self) -> Role:
        """The role that receives encoder output: prefill when split, else the PD pool."""
        return Role.PREFILL if self.split else self.generator_role

    @property
    def generator_role(self) -> Role:
        """The role that produces the tokens the client reads."""
        return Role.DECODE if Role.DECODE in self.roles else Role.PD

    def replace(self, role: Role, specs: Iterable[InstanceSpec], *, healthy: bool = False) -> None:
        """Make `specs` the role's members; instances that stay keep their state, new ones start `healthy`."""
        old = self.members.get(role, {})
        new: dict[str, Instance] = {}
        changed = role not in self.members
        for spec in specs:
            kept = old.get(spec.url)
            if kept is None:
                kept = Instance(role, spec, healthy=healthy)
                changed = True
            elif kept.spec != spec:
                kept.spec = spec  # same URL, new addresses: keep its health and load
                kept.engine_id = None
                changed = True
            new[spec.url] = kept
        if changed or new.keys() != old.keys():
            self.version += 1
        self.members[role] = new

    def instances(self, role: Role | None = None) -> list[Instance]:
        if role is not None:
            return list(self.members.get(role, {}).values())
        return [i for members in self.members.values() for i in members.values()]

    def get(self, role: Role, url: str) -> Instance | None:
        return self.members.get(role, {}).get(url)

    def candidates(self, role: Role) -> list[Candidate]:
        return [i.candidate() for i in self.members.get(role, {}).values()]

    def set_revisions(self, revisions: Mapping[str, PodRevision]) -> None:
        """The pod watch's latest revisions (a membership change, as routing sees it)."""
        self.revisions = revisions
        self.version += 1

    def revision_of(self, instance: Instance) -> str:
        """Its pod's model revision; "" when the pod watch has not shown it (it then pairs with nothing)."""
        known = self.revisions.get(instance.spec.name)
        return known.revision if known is not None else ""

    def routing_revision(self) -> str | None:
        """The revision new requests go to: of those with a healthy instance in every role, the one with the
        newest pod (a roll's new set, once whole, takes over and the old one drains); None when no revision has
        a whole healthy set."""
        for revision, by_role in self._revision_index().newest_first:
            if all(any(i.healthy for i in by_role.get(role, ())) for role in self.required):
                return revision
        return None

    def superseded(self, revision: str) -> bool:
        """True while another revision has a pod newer than any of `revision`'s (the order `routing_revision`
        ranks by): a roll away from it is under way. The pod watch lists pods before they are Ready, so this
        holds from the new set's start; only a failed request asks (no index)."""
        newest: dict[str, str] = {}
        for known in self.revisions.values():
            newest[known.revision] = max(newest.get(known.revision, ""), known.created)
        if revision not in newest:
            return False
        mine = (newest[revision], revision)
        return any((created, other) > mine for other, created in newest.items() if other != revision)

    def of_other_revisions(self, role: Role, revision: str) -> frozenset[str]:
        """The instances of `role` a request of `revision` must not use."""
        index = self._revision_index()
        others = index.others.get((role, revision))
        return others if others is not None else index.every.get(role, frozenset())

    def _revision_index(self) -> _RevisionIndex:
        """The instances grouped by revision, rebuilt only when membership or revisions change (`version`): a
        request's revision choice is on every request's path, and health flips need no rebuild."""
        if self._by_revision is None or self._by_revision.version != self.version:
            self._by_revision = _RevisionIndex.of(self)
        return self._by_revision

    def revision_summary(self) -> str:
        """Each role's healthy instances by revision, for the error a request gets when no set is whole."""
        parts = []
        for role in sorted(self.roles):
            revisions = sorted(self.revision_of(i) or "unknown" for i in self.instances(role) if i.healthy)
            parts.append(f"{role.value} {', '.join(revisions) or 'none healthy'}")
        return "; ".join(parts)

    def failing_senders(self, receiver: str) -> frozenset[str]:
        """The senders whose transfers to `receiver` fail."""
        return frozenset(s for s, r in self.failing if r == receiver)

    def failing_receivers(self, sender: str) -> frozenset[str]:
        """The receivers `sender`'s transfers do not reach."""
        return frozenset(r for s, r in self.failing if s == sender)

    @property
    def required(self) -> frozenset[Role]:
        """The roles that must have a healthy instance for the proxy to serve."""
        return self.roles - self.optional

    def healthy(self, role: Role) -> bool:
        return any(i.healthy for i in self.instances(role))

    def healthy_roles(self) -> dict[Role, bool]:
        """Per required role: does it have a healthy instance?"""
        return {role: self.healthy(role) for role in sorted(self.required)}

    def ready(self) -> bool:
        """The proxy is healthy only when every required role has a healthy instance."""
        return all(self.healthy_roles().values())


@dataclass(frozen=True)
class _RevisionIndex:
    """A roster's instances by model revision at one `Roster.version` (pure data; health is read live)."""

    version: int
    newest_first: tuple[tuple[str, dict[Role, tuple[Instance, ...]]], ...]
    """Each known revision (never ""), by its newest pod's creation, then by name, newest first."""
    others: dict[tuple[Role, str], frozenset[str]]
    """(role, revision) -> the URLs of that role's instances of any other revision."""
    every: dict[Role, frozenset[str]]
    """Each role's URLs: what a revision no instance has must avoid."""

    @classmethod
    def of(cls, roster: Roster) -> _RevisionIndex:
        grouped: dict[str, dict[Role, list[Instance]]] = {}
        for instance in roster.instances():
            grouped.setdefault(roster.revision_of(instance), {}).setdefault(instance.role, []).append(instance)
        newest = dict.fromkeys(grouped, "")
        for known in roster.revisions.values():
            if known.revision in newest:
                newest[known.revision] = max(newest[known.revision], known.created)
        order = sorted((r for r in grouped if r), key=lambda r: (newest[r], r), reverse=True)
        every = {role: frozenset(i.url for i in roster.instances(role)) for role in roster.members}
        others = {
            (role, revision): every[role] - {i.url for i in grouped[revision].get(role, [])}
            for revision in grouped
            for role in every
        }
        return cls(
            roster.version,
            tuple((r, {role: tuple(members) for role, members in grouped[r].items()}) for r in order),
            others,
            every,
        )


class Outstanding:
    """Count a request against the instance while it runs (least-outstanding routing reads the count). A class,
    not a generator context manager, as it is on every request's path."""

    __slots__ = ("_instance",)

    def __init__(self, instance: Instance) -> None:
        self._instance = instance

    def __enter__(self) -> Instance:
        self._instance.outstanding += 1
        return self._instance

    def __exit__(self, *_: object) -> None:
        self._instance.outstanding -= 1
