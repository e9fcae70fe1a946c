"""The routing policy as pure functions: which instance gets a media item, a prefill or a decode.

Encoders are chosen by rendezvous (highest-random-weight) hashing of the item's uuid: every uuid has a fixed
preference order over the known encoders, so a repeated image meets the encoder that already holds its output,
adding or removing an encoder moves only the items it wins or held, and on failure the next healthy encoder in
that order takes the item. Prefill and decode go to the instance with the fewest requests outstanding.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import NamedTuple


class Candidate(NamedTuple):
    """What routing needs to know about one instance (a tuple: the roster makes them on every request)."""

    key: str
    """A stable identity (the base URL)."""
    healthy: bool = True
    outstanding: int = 0


def _score(item_key: str, instance_key: str) -> int:
    digest = hashlib.blake2b(f"{item_key}\x00{instance_key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def preference(item_key: str, instances: Iterable[str]) -> list[str]:
    """Every instance in this item's fixed order of preference (highest rendezvous score first)."""
    return sorted(instances, key=lambda key: (_score(item_key, key), key), reverse=True)


def pick_encoder(item_key: str, candidates: Sequence[Candidate], exclude: frozenset[str] = frozenset()) -> str | None:
    """The first healthy, not excluded encoder in the item's preference order; None when there is none."""
    healthy = {c.key for c in candidates if c.healthy and c.key not in exclude}
    for key in preference(item_key, (c.key for c in candidates)):
        if key in healthy:
            return key
    return None


def is_affinity_hit(item_key: str, candidates: Sequence[Candidate], chosen: str) -> bool:
    """True when the item went to its first choice among all known encoders (healthy or not)."""
    order = preference(item_key, (c.key for c in candidates))
    return bool(order) and order[0] == chosen


def least_outstanding(
    candidates: Sequence[Candidate], exclude: frozenset[str] = frozenset(), tiebreak: int = 0
) -> str | None:
    """The healthy, not excluded instance with the fewest outstanding requests; ties rotate with `tiebreak`."""
    tied: list[str] = []
    fewest = 0
    for candidate in candidates:
        if not candidate.healthy or candidate.key in exclude:
            continue
        if not tied or candidate.outstanding < fewest:
            fewest, tied = candidate.outstanding, [candidate.key]
        elif candidate.outstanding == fewest:
            tied.append(candidate.key)
    return tied[tiebreak % len(tied)] if tied else None


def pick_dp_rank(dp_size: int, counter: int) -> int | None:
    """Which data-parallel replica of a consumer gets the request (round-robin); None when there is one."""
    return counter % dp_size if dp_size > 1 else None


def split_ec_addresses(consumers: Sequence[str], addresses: Sequence[str]) -> dict[str, list[str]]:
    """Each consumer's EC control addresses, one per data-parallel replica, from the flat list the bundle gives
    (consumers in order, each one's replicas consecutively: s0r0, s0r1, s1r0, s1r1).

    ValueError when the list cannot be split evenly: a wrong address would send embeddings to another replica.
    """
    if not addresses:
        return {c: [] for c in consumers}
    if not consumers or len(addresses) % len(consumers):
        raise ValueError(
            f"{len(addresses)} EC consumer addresses do not divide among {len(consumers)} consumers; "
            "give one address per consumer and data-parallel replica"
        )
    per = len(addresses) // len(consumers)
    return {c: list(addresses[i * per : (i + 1) * per]) for i, c in enumerate(consumers)}
