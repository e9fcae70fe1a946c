"""Set up a Mooncake store requester exactly as vLLM does, and check that the store answers.

The launcher waits for the store with it, the store tests drive real processes through it, and the benchmarks
measure through it, so all three exercise the same setup call vLLM makes from the same JSON. Mooncake is
imported lazily: the config package must import without the native wheel. The Mooncake calls return negative
codes instead of raising, and ``setup()`` blocks about 90 s when no master answers; so we wait for the
master's /health first and turn codes into ``StoreError`` with a name.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from epd_connectors.config.mooncake import MooncakeStoreConfig

# Codes from Mooncake's ErrorCode (mooncake-store/include/types.h) that callers branch on.
OBJECT_NOT_FOUND = -704
NO_AVAILABLE_HANDLE = -200
"""The pool (or the preferred segment) has no room for the value."""
RPC_FAIL = -900
"""The master did not answer (about 4 s per call)."""
TENANT_QUOTA_EXCEEDED = -1700
TENANT_NOT_REGISTERED = -1701
_NAMES = {
    OBJECT_NOT_FOUND: "object not found",
    NO_AVAILABLE_HANDLE: "no space in the pool",
    RPC_FAIL: "master unreachable",
    TENANT_QUOTA_EXCEEDED: "tenant quota exceeded",
    TENANT_NOT_REGISTERED: "tenant not registered with the master",
}

DEFAULT_WAIT_S = 60.0
"""How long the launcher waits for the master before giving up; a master starts in well under a second,
so a minute covers image pulls and scheduling of the master pod without hiding a wrong address for long."""


class StoreError(RuntimeError):
    """A Mooncake call failed; ``code`` is Mooncake's negative ErrorCode."""

    def __init__(self, operation: str, code: int) -> None:
        self.operation = operation
        self.code = code
        super().__init__(f"{operation} failed with {code} ({describe(code)})")


def describe(code: int) -> str:
    """A short name for a Mooncake return code."""
    return _NAMES.get(code, "see mooncake-store/include/types.h")


def wait_for_master(health_url: str, timeout_s: float = DEFAULT_WAIT_S, interval_s: float = 0.1) -> None:
    """Poll the master's /health until it serves; raises TimeoutError naming the URL and the last answer.

    Serving means HTTP 200 and, when the body says so, ``"service_ready": true``: an HA standby and a leader
    still warming up also answer 200 (``{"status": "ok", "role": "standby", "service_ready": false}``).
    """
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        try:
            with urllib.request.urlopen(health_url, timeout=1.0) as response:
                body = response.read()
                if response.status == 200 and service_ready(body):
                    return
                last = f"HTTP {response.status} {body[:200].decode(errors='replace')}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        if time.monotonic() >= deadline:
            raise TimeoutError(f"Mooncake master not healthy at {health_url} after {timeout_s:.0f} s: {last}")
        time.sleep(interval_s)


def service_ready(body: bytes) -> bool:
    """False only when the health JSON says the master does not serve yet (older masters send no flag)."""
    try:
        health = json.loads(body)
    except ValueError:
        return True
    return not isinstance(health, dict) or serves(health)


def serves(health: Mapping[str, Any]) -> bool:
    """Whether a master's /health JSON says it serves: an HA standby and a leader still warming up say
    ``"service_ready": false``; older masters send no flag."""
    return health.get("service_ready", True) is not False


def master_capacity_bytes(metrics_url: str) -> int:
    """Bytes of pool mounted on the master (its ``master_total_capacity_bytes`` gauge); 0 if absent."""
    with urllib.request.urlopen(metrics_url, timeout=2.0) as response:
        return capacity_from_metrics(response.read().decode()) or 0


def capacity_from_metrics(text: str) -> int | None:
    """The ``master_total_capacity_bytes`` gauge from the master's Prometheus text; None when absent."""
    value = metric_samples(text).get("master_total_capacity_bytes", {}).get(())
    return int(value) if value is not None else None


Labels = tuple[tuple[str, str], ...]
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def metric_samples(text: str) -> dict[str, dict[Labels, float]]:
    """Prometheus text exposition as {metric name: {sorted labels: value}} (comments and bad lines skipped)."""
    samples: dict[str, dict[Labels, float]] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        samples.setdefault(name, {})[tuple(sorted(_LABEL.findall(labels or "")))] = number
    return samples


def wait_for_capacity(
    metrics_url: str, at_least: int, timeout_s: float = DEFAULT_WAIT_S, interval_s: float = 0.1
) -> int:
    """Wait until store owners have mounted ``at_least`` bytes (a standalone-store requester has nowhere to
    put data before that); returns the capacity, raises TimeoutError naming what was seen."""
    deadline = time.monotonic() + timeout_s
    seen = 0
    while True:
        try:
            seen = master_capacity_bytes(metrics_url)
        except (urllib.error.URLError, OSError, ValueError):
            seen = 0
        if seen >= at_least:
            return seen
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"Mooncake pool at {metrics_url} holds {seen} bytes after {timeout_s:.0f} s, "
                f"expected at least {at_least}"
            )
        time.sleep(interval_s)


def open_store(config: MooncakeStoreConfig, local_hostname: str) -> Any:
    """A set-up ``MooncakeDistributedStore`` for this config (the caller closes it).

    ``local_hostname`` is the address peers reach this process at (vLLM: VLLM_HOST_IP); in embedded mode
    this process's segment is served from it.
    """
    from mooncake.store import MooncakeDistributedStore  # noqa: PLC0415 - native wheel, optional at import

    store = MooncakeDistributedStore()
    code = store.setup(**config.setup_kwargs(local_hostname))
    if code != 0:
        raise StoreError("setup", int(code))
    return store


@dataclass(frozen=True)
class ProbeResult:
    """What one put/get round trip through the store took."""

    put_s: float
    get_s: float
    size: int


def probe(store: Any, key: str, value: bytes) -> ProbeResult:
    """Put ``value`` under ``key``, read it back and compare; raises StoreError on any failure.

    The key is removed first because a put on an existing key keeps the old value.
    """
    store.remove(key)
    start = time.perf_counter()
    code = store.put(key, value)
    put_s = time.perf_counter() - start
    if code != 0:
        raise StoreError(f"put {key!r}", int(code))
    start = time.perf_counter()
    got = store.get(key)
    get_s = time.perf_counter() - start
    if got != value:
        raise StoreError(f"get {key!r}", OBJECT_NOT_FOUND if not got else -1)
    return ProbeResult(put_s=put_s, get_s=get_s, size=len(value))
