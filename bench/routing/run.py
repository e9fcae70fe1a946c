"""The proxy's per-request routing choice with model revisions known, against the same choice without them.

On Kubernetes the proxy's pod watch fills `Roster.revisions`, and every request then picks the routing revision
and leaves out the other revisions' instances before choosing the least-loaded consumer and decode
(proxy/flow.py). A static roster (the local runner, `bench/proxy`) takes neither step. This times
both choices in process, over the roster code itself, for an E/P/D roster of N instances per role: once with one
revision (steady state) and once mid-roll (half the instances of each role on a second revision). The peer is the
static choice; the figure to watch is the added microseconds beside the proxy's CPU per request (bench/proxy,
hundreds of microseconds), not the ratio alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit
from collections.abc import Callable

from epd_connectors.config.roles import Role
from epd_connectors.proxy import routing
from epd_connectors.proxy.roster import InstanceSpec, PodRevision, Roster

ROLES = (Role.ENCODER, Role.PREFILL, Role.DECODE)


def roster_of(per_role: int, *, revisions: int) -> Roster:
    """Every instance healthy and carrying some load; `revisions` 0 leaves the roster static."""
    specs = {
        role: [InstanceSpec(f"http://{role.value}-{i}:8000", name=f"{role.value}-{i}") for i in range(per_role)]
        for role in ROLES
    }
    roster = Roster.build(specs, healthy=True)
    for n, instance in enumerate(roster.instances()):
        instance.outstanding = n % 3
    if revisions:
        older, newer = PodRevision("rev-a", "2026-12-03T07:00:00Z"), PodRevision("rev-b", "2026-12-03T08:00:00Z")
        roster.set_revisions(
            {
                f"{role.value}-{i}": newer if revisions > 1 and i % 2 == 1 else older
                for role in ROLES
                for i in range(per_role)
            }
        )
    return roster


def choice(roster: Roster) -> Callable[[], object]:
    """What flow.Flow does before a text request's first byte leaves: consumer, then decode."""
    tiebreak = iter(range(sys.maxsize))

    def choose() -> object:
        avoid: frozenset[str] = frozenset()
        if roster.revisions:
            revision = roster.routing_revision()
            assert revision is not None
            avoid = roster.of_other_revisions(Role.PREFILL, revision)
        consumer = routing.least_outstanding(roster.candidates(Role.PREFILL), avoid, next(tiebreak))
        assert consumer is not None
        decode_avoid: frozenset[str] = frozenset()
        if roster.revisions:
            prefill = roster.get(Role.PREFILL, consumer)
            assert prefill is not None
            decode_avoid = roster.of_other_revisions(Role.DECODE, roster.revision_of(prefill))
        return routing.least_outstanding(roster.candidates(Role.DECODE), decode_avoid, next(tiebreak))

    return choose


def interleaved(calls: dict[str, Callable[[], object]], rounds: int) -> dict[str, tuple[float, float]]:
    """Per call: the median µs per call and the median ratio to the first call, over `rounds` rounds that each
    time every call once (so a slow moment of the machine hits all alike)."""
    timers = {name: timeit.Timer(call) for name, call in calls.items()}
    number = max(timer.autorange()[0] for timer in timers.values())
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, timer in timers.items():
            samples[name].append(timer.timeit(number) / number * 1e6)
    first = samples[next(iter(calls))]
    return {
        name: (statistics.median(times), statistics.median(t / f for t, f in zip(times, first, strict=True)))
        for name, times in samples.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=lambda text: [int(n) for n in text.split(",")], default=[2, 4, 16, 64])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    print("instances per role | static µs | one revision µs (x static) | mid-roll µs (x static)")
    for size in args.sizes:
        figures = interleaved(
            {
                "static": choice(roster_of(size, revisions=0)),
                "one": choice(roster_of(size, revisions=1)),
                "rolling": choice(roster_of(size, revisions=2)),
            },
            args.rounds,
        )
        (static, _), (one, one_x), (rolling, rolling_x) = figures.values()
        print(
            f"{size:>18} | {static:9.2f} | {one:8.2f} ({one_x:4.2f}x){'':>10} | {rolling:8.2f} ({rolling_x:4.2f}x)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
