"""The static roster: instances from the role's bundle (Service DNS names in a cluster, loopback ports
locally) and from command-line flags, and the Services discovery should watch instead.

Kept apart from the command line so the mapping from bundle peers to roster is one pure function the tests
call directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from epd_connectors.config.base import address
from epd_connectors.config.bundle import Endpoint, Peers
from epd_connectors.config.roles import Role
from epd_connectors.proxy.discovery_slices import RoleWatch
from epd_connectors.proxy.roster import InstanceSpec
from epd_connectors.proxy.routing import split_ec_addresses


@dataclass(frozen=True)
class StaticRoster:
    """Base URLs per role plus the per-instance extras; a role with no list is not part of the deployment."""

    encoders: Sequence[str] = ()
    prefill: Sequence[str] = ()
    decode: Sequence[str] = ()
    pd: Sequence[str] = ()
    ec_consumers: Sequence[str] = ()
    """EC control addresses of the consumers (prefill, else pd/decode), each one's DP replicas consecutively."""
    ec_per_consumer: Sequence[Sequence[str]] = ()
    """Or each consumer's own addresses, in consumer order (a bundle's endpoints say each one's DP size)."""
    bootstrap_ports: Sequence[int] = field(default_factory=tuple)
    """MooncakeConnector bootstrap port per prefill URL, or one for all."""

    def specs(self) -> dict[Role, list[InstanceSpec]]:
        """The roster's roles and instances; ValueError for an inconsistent combination."""
        pd = list(self.pd) or ([] if self.prefill else list(self.decode))
        decode = list(self.decode) if self.prefill else []
        if self.prefill and not decode:
            raise ValueError("prefill instances need decode instances; give --decode (or use --pd without prefill)")
        if not pd and not decode:
            raise ValueError("no decode or pd instance; give --pd URL (combined) or --prefill and --decode")
        consumers = list(self.prefill) or pd
        if self.ec_per_consumer and len(self.ec_per_consumer) != len(consumers):
            raise ValueError(f"EC addresses for {len(self.ec_per_consumer)} consumers, not {len(consumers)}")
        ec = (
            {c: list(a) for c, a in zip(consumers, self.ec_per_consumer, strict=True)}
            if self.ec_per_consumer
            else split_ec_addresses(consumers, self.ec_consumers)
        )
        ports = list(self.bootstrap_ports)
        if ports and len(ports) not in (1, len(self.prefill)):
            raise ValueError(f"{len(ports)} bootstrap ports for {len(self.prefill)} prefill instances")
        specs: dict[Role, list[InstanceSpec]] = {}
        if self.encoders:
            specs[Role.ENCODER] = [InstanceSpec(_base(u)) for u in self.encoders]
        if self.prefill:
            specs[Role.PREFILL] = [
                InstanceSpec(_base(u), tuple(ec[u]), _bootstrap(u, ports[min(i, len(ports) - 1)]) if ports else None)
                for i, u in enumerate(self.prefill)
            ]
            specs[Role.DECODE] = [InstanceSpec(_base(u)) for u in decode]
        else:
            specs[Role.PD] = [InstanceSpec(_base(u), tuple(ec[u])) for u in pd]
        return specs


def from_peers(peers: Peers) -> StaticRoster:
    """The bundle's peers as a static roster: each consumer's EC addresses at its own host, each prefill's
    bootstrap port."""

    def urls(endpoints: Sequence[Endpoint]) -> list[str]:
        return [e.url() for e in endpoints]

    bootstrap = [e.bootstrap_port for e in peers.prefill]
    return StaticRoster(
        encoders=urls(peers.encoders),
        prefill=urls(peers.prefill),
        decode=urls(peers.decode),
        pd=urls(peers.pd),
        ec_consumers=list(peers.ec_consumers),
        ec_per_consumer=peers.ec_per_consumer(),
        bootstrap_ports=[p for p in bootstrap if p is not None] if all(bootstrap) else [],
    )


def watches_from_peers(peers: Peers) -> list[RoleWatch]:
    """Discovery targets from the bundle: one watch per endpoint, its Service the first DNS label of the host,
    with the endpoint's own EC layout and bootstrap port (each prefill pool has its own Service and sizes)."""
    split = bool(peers.prefill)
    out: list[RoleWatch] = []
    for endpoint in peers.encoders:
        out.append(RoleWatch(Role.ENCODER, _service(endpoint), port=endpoint.port))
    for prefill in peers.prefill:
        out.append(
            RoleWatch(
                Role.PREFILL,
                _service(prefill),
                port=prefill.port,
                ec=prefill.ec,
                bootstrap_port=prefill.bootstrap_port,
            )
        )
    if split:
        out += [RoleWatch(Role.DECODE, _service(e), port=e.port) for e in peers.decode]
    else:
        out += [RoleWatch(Role.PD, _service(e), port=e.port, ec=e.ec) for e in peers.pd]
    return out


def _service(endpoint: Endpoint) -> str:
    return endpoint.host.split(".")[0]


def _base(url: str) -> str:
    url = url.rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{url!r} is not an http(s) base URL such as http://127.0.0.1:8000")
    return url


def _bootstrap(url: str, port: int) -> str:
    return address("http", urlsplit(url).hostname or "", port)
