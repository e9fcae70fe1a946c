"""Routing policy: consistent hashing for encoders (affinity, failover, stability), least outstanding for the
rest, data-parallel EC addresses (epd_connectors.proxy.routing)."""

from __future__ import annotations

import pytest

from epd_connectors.proxy.routing import (
    Candidate,
    is_affinity_hit,
    least_outstanding,
    pick_dp_rank,
    pick_encoder,
    preference,
    split_ec_addresses,
)

pytestmark = pytest.mark.unit

ENCODERS = [Candidate(f"http://e{i}:8000") for i in range(4)]
KEYS = [f"uuid-{i}" for i in range(400)]


def test_the_same_uuid_always_meets_the_same_encoder() -> None:
    for key in KEYS[:20]:
        first = pick_encoder(key, ENCODERS)
        assert first is not None
        assert all(pick_encoder(key, list(reversed(ENCODERS))) == first for _ in range(3))
        assert is_affinity_hit(key, ENCODERS, first)


def test_items_spread_over_encoders() -> None:
    counts: dict[str, int] = {}
    for key in KEYS:
        chosen = pick_encoder(key, ENCODERS)
        assert chosen is not None
        counts[chosen] = counts.get(chosen, 0) + 1
    assert len(counts) == 4
    assert min(counts.values()) > 50


def test_failover_goes_to_the_next_encoder_in_the_items_order() -> None:
    for key in KEYS[:50]:
        order = preference(key, [c.key for c in ENCODERS])
        down = [Candidate(c.key, healthy=c.key != order[0]) for c in ENCODERS]
        assert pick_encoder(key, down) == order[1]
        assert not is_affinity_hit(key, ENCODERS, order[1])
        assert pick_encoder(key, ENCODERS, exclude=frozenset(order[:2])) == order[2]
    assert pick_encoder("k", [Candidate("a", healthy=False)]) is None


def test_removing_an_encoder_moves_only_its_items() -> None:
    before = {k: pick_encoder(k, ENCODERS) for k in KEYS}
    after = {k: pick_encoder(k, ENCODERS[:3]) for k in KEYS}
    moved = [k for k in KEYS if before[k] != after[k]]
    assert moved and all(before[k] == ENCODERS[3].key for k in moved)


def test_least_outstanding_skips_busy_unhealthy_and_excluded() -> None:
    pool = [Candidate("a", outstanding=3), Candidate("b", outstanding=1), Candidate("c", healthy=False)]
    assert least_outstanding(pool) == "b"
    assert least_outstanding(pool, exclude=frozenset({"b"})) == "a"
    assert least_outstanding([Candidate("c", healthy=False)]) is None


def test_ties_rotate() -> None:
    pool = [Candidate("a"), Candidate("b")]
    assert {least_outstanding(pool, tiebreak=t) for t in range(4)} == {"a", "b"}


def test_dp_rank_round_robin() -> None:
    assert pick_dp_rank(1, 7) is None
    assert [pick_dp_rank(2, n) for n in range(4)] == [0, 1, 0, 1]


def test_ec_addresses_split_per_consumer_replicas_consecutive() -> None:
    addresses = ["tcp://p0:14579", "tcp://p0:14580", "tcp://p1:14579", "tcp://p1:14580"]
    assert split_ec_addresses(["P0", "P1"], addresses) == {"P0": addresses[:2], "P1": addresses[2:]}
    assert split_ec_addresses(["P0"], []) == {"P0": []}
    with pytest.raises(ValueError, match="do not divide"):
        split_ec_addresses(["P0", "P1"], addresses[:3])
