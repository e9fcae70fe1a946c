"""Waiting for a role's dependencies, with progress lines and a deadline.

A role whose dependency is not up waits here instead of crash-looping: the Mooncake store's setup() blocks for
about 90 s and then fails opaquely when the master is absent, so store users wait for the master's /health first,
and in standalone-store mode encoders also wait until a store owner has mounted its segment (master capacity > 0).
"""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from epd_connectors import store_probe

CheckKind = Literal["master-health", "store-capacity"]

DEFAULT_PROBE_TIMEOUT_S = 2.0
"""Per-probe HTTP timeout: short, because the deadline, not one probe, decides when to give up."""


@dataclass(frozen=True)
class Dependency:
    """One thing a role waits for before it starts."""

    kind: CheckKind
    url: str
    description: str
    """What the user reads in progress lines, e.g. "the Mooncake master"."""


class DependencyTimeoutError(Exception):
    """The deadline passed; ``str()`` is the one line the launcher prints."""


def probe(dep: Dependency, timeout_s: float = DEFAULT_PROBE_TIMEOUT_S) -> str | None:
    """None when the dependency is ready, otherwise why not (for the progress line)."""
    try:
        with urllib.request.urlopen(dep.url, timeout=timeout_s) as resp:
            body = resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return str(reason)
    if dep.kind == "master-health":
        return _master_health_problem(body)
    return _store_capacity_problem(body)


def _master_health_problem(body: str) -> str | None:
    if not store_probe.service_ready(body.encode()):
        return f"master not serving yet ({body.strip()[:120]})"
    return None


def _store_capacity_problem(metrics: str) -> str | None:
    """Prometheus text from the master: ready once some store owner has mounted a segment."""
    capacity = store_probe.capacity_from_metrics(metrics)
    if capacity is None:
        return "master metrics have no master_total_capacity_bytes"
    return None if capacity > 0 else "no store client has mounted a segment yet"


def wait_for_all(
    deps: list[Dependency],
    *,
    deadline_s: float,
    interval_s: float,
    say: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Wait for each dependency in order; one progress line per attempt that fails; raise at the deadline."""
    start = clock()
    for dep in deps:
        attempt = 0
        while True:
            problem = probe(dep)
            elapsed = clock() - start
            if problem is None:
                say(f"{dep.description} is ready ({elapsed:.1f}s)")
                break
            if elapsed >= deadline_s:
                raise DependencyTimeoutError(
                    f"gave up after {deadline_s:.0f}s waiting for {dep.description} at {dep.url}: {problem}. "
                    "Check that it is running and reachable from this pod, or raise wait.deadline_s in the bundle"
                )
            if attempt % max(1, int(5 / max(interval_s, 0.01))) == 0:
                say(f"waiting for {dep.description} at {dep.url} ({elapsed:.0f}s of {deadline_s:.0f}s): {problem}")
            attempt += 1
            sleep(min(interval_s, max(0.0, deadline_s - elapsed)))


def main(argv: list[str] | None = None) -> int:
    """`python -m epd_connectors.launch.readiness URL`: exit 0 when the master at the /health URL serves.

    An HA master's readiness probe: every master answers /health 200, the standbys too, so only this check
    keeps the master Service's endpoints to the leader that serves."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m epd_connectors.launch.readiness http://HOST:METRICS_PORT/health", file=sys.stderr)
        return 2
    problem = probe(Dependency("master-health", args[0], "the Mooncake master"))
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
