"""The static roster: instances from the role's bundle (Service DNS names in a cluster, loopback ports
locally) and from command-line flags, and the Services discovery should watch instead.

Kept apart from the command line so the mapping from bundle peers to roster is one pure function the tests
call directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from epd_connectors.config.bundle import Endpoint, Peers, Role
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
        ec = split_ec_addresses(consumers, self.ec_consumers)
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
    """The bundle's peers as a static roster."""

    def urls(endpoints: Sequence[Endpoint]) -> list[str]:
        return [e.url() for e in endpoints]

    return StaticRoster(
        encoders=urls(peers.encoders),
        prefill=urls(peers.prefill),
        decode=urls(peers.decode),
        pd=urls(peers.pd),
        ec_consumers=list(peers.ec_consumers),
    )


def watches_from_peers(
    peers: Peers,
    *,
    ec_port: int | None,
    ec_tp: Sequence[int] = (),
    ec_dp: Sequence[int] = (),
    bootstrap_ports: Sequence[int] = (),
) -> list[RoleWatch]:
    """Discovery targets from the bundle: one watch per endpoint, its Service the first DNS label of the host.

    A role may have several Services (each prefill pool has its own), and a pool's parallel sizes decide its
    pods' EC control ports, so the per-consumer settings are given per consumer endpoint in the bundle's
    order, or one value for all (as `StaticRoster.bootstrap_ports`); none means 1 (sizes) or no port.
    ValueError when a list matches neither.
    """
    split = bool(peers.prefill)
    consumer = Role.PREFILL if split else Role.PD
    consumers = list(peers.prefill) if split else list(peers.pd or peers.decode)
    tp = _per_endpoint(ec_tp, len(consumers), "EC tensor-parallel sizes (--ec-tp-size)") or [1] * len(consumers)
    dp = _per_endpoint(ec_dp, len(consumers), "EC data-parallel sizes (--ec-dp-size)") or [1] * len(consumers)
    bootstrap = _per_endpoint(bootstrap_ports, len(peers.prefill), "bootstrap ports (--prefill-bootstrap-port)")
    out: list[RoleWatch] = []
    for role, endpoints in (
        (Role.ENCODER, list(peers.encoders)),
        (Role.PREFILL, list(peers.prefill)),
        (Role.DECODE if split else Role.PD, list(peers.decode) if split else consumers),
    ):
        for i, endpoint in enumerate(endpoints):
            is_consumer = role is consumer
            out.append(
                RoleWatch(
                    role,
                    endpoint.host.split(".")[0],
                    port=endpoint.port,
                    ec_port=ec_port if is_consumer else None,
                    ec_tensor_parallel_size=tp[i] if is_consumer else 1,
                    ec_data_parallel_size=dp[i] if is_consumer else 1,
                    bootstrap_port=bootstrap[i] if bootstrap and role is Role.PREFILL else None,
                )
            )
    return out


def _per_endpoint(values: Sequence[int], count: int, what: str) -> list[int]:
    """`values` spread over `count` endpoints: one each, or one for all; [] when none are given."""
    if any(v < 1 for v in values):
        raise ValueError(f"{what} {list(values)}: each must be at least 1")
    if not values:
        return []
    if len(values) == 1:
        return [values[0]] * count
    if len(values) != count:
        raise ValueError(f"{len(values)} {what} for {count} Services; give one per Service, in the bundle's order")
    return list(values)


def _base(url: str) -> str:
    url = url.rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{url!r} is not an http(s) base URL such as http://127.0.0.1:8000")
    return url


def _bootstrap(url: str, port: int) -> str:
    host = urlsplit(url).hostname or ""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
