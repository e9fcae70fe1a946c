"""Active health probing: each instance's /health, with eviction after repeated failures and re-admission.

A pod can be Ready for Kubernetes and still unable to serve (an engine that died), and a static roster has no
readiness at all, so the proxy probes every instance itself. One failed probe is forgiven (`evict_after`), a
probe that goes unanswered is forgiven for `slow_probe_grace_s` (busy, not dead), and a recovered instance
returns after `readmit_after` good probes. Request failures that show an instance is
unreachable evict it at once (encode.record_failure); the prober brings it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time

from epd_connectors.proxy.backend import Backend
from epd_connectors.proxy.errors import ProxyError
from epd_connectors.proxy.roster import Instance, Roster
from epd_connectors.proxy.settings import Limits, Timeouts

log = logging.getLogger(__name__)


class Probe(enum.Enum):
    """What one probe found."""

    ANSWERED = "answered"
    FAILED = "failed"
    """Refused, reset or an error status: the instance is down or broken."""
    UNANSWERED = "unanswered"
    """Connected, then no answer within the probe timeout: busy or hung, which a slow moment cannot tell apart."""


def apply_probe(instance: Instance, probe: Probe, limits: Limits, now: float) -> bool:
    """Update the instance from one probe (`now` on the monotonic clock); True when its routing state flipped."""
    if probe is Probe.ANSWERED:
        instance.successes += 1
        instance.failures = 0
        instance.failing_since = None
        if not instance.healthy and instance.successes >= limits.readmit_after:
            instance.healthy = True
            return True
        return False
    instance.failures += 1
    instance.successes = 0
    if instance.failing_since is None:
        instance.failing_since = now
    instance.engine_id = None  # a prefill that fails a probe may come back as a new engine: ask again
    patient = probe is Probe.UNANSWERED and now - instance.failing_since < limits.slow_probe_grace_s
    if instance.healthy and instance.failures >= limits.evict_after and not patient:
        instance.healthy = False
        return True
    return False


class Prober:
    """Probes the whole roster every `probe_interval_s`; `wake` probes at once (new members). An interval of 0
    turns it off (Limits.probing): it then never sends a probe, whoever calls it."""

    def __init__(self, roster: Roster, backend: Backend, limits: Limits, timeouts: Timeouts) -> None:
        self._roster = roster
        self._backend = backend
        self._limits = limits
        self._timeouts = timeouts
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def probe_once(self) -> None:
        """One round over every instance, concurrently (none when probing is off)."""
        if not self._limits.probing:
            return
        instances = self._roster.instances()
        results = await asyncio.gather(*(self._probe(i) for i in instances))
        now = time.monotonic()
        for instance, probe in zip(instances, results, strict=True):
            if apply_probe(instance, probe, self._limits, now):
                if instance.healthy:
                    log.info("%s %s admitted (its /health answers)", instance.role.value, instance.url)
                else:
                    log.warning(
                        "%s %s evicted after %d failed probes (the last %s)",
                        instance.role.value,
                        instance.url,
                        instance.failures,
                        probe.value,
                    )

    async def _probe(self, instance: Instance) -> Probe:
        try:
            async with asyncio.timeout(self._timeouts.probe):
                status, _ = await self._backend.get(instance.url + "/health", role=instance.role.value)
        except TimeoutError:
            return Probe.UNANSWERED
        except ProxyError:
            return Probe.FAILED
        return Probe.ANSWERED if status == 200 else Probe.FAILED

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        if not self._limits.probing:
            return  # no loop: with a zero interval it would probe without pause
        self._task = asyncio.create_task(self._loop(), name="epd-proxy-prober")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            try:
                await self.probe_once()
            except Exception:  # a prober that dies silently would freeze the roster; log and go on
                log.exception("health probe round failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._limits.probe_interval_s):
                    await self._wake.wait()
            self._wake.clear()
