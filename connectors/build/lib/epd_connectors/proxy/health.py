"""Active health probing: each instance's /health, with eviction after repeated failures and re-admission.

A pod can be Ready for Kubernetes and still unable to serve (an engine that died), and a static roster has no
readiness at all, so the proxy probes every instance itself. One failed probe is forgiven (`evict_after`), a
recovered instance returns after `readmit_after` good probes. Request failures that show an instance is
unreachable evict it at once (encode.record_failure); the prober brings it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from epd_connectors.proxy.backend import Backend
from epd_connectors.proxy.errors import ProxyError
from epd_connectors.proxy.roster import Instance, Roster
from epd_connectors.proxy.settings import Limits, Timeouts

log = logging.getLogger(__name__)


def apply_probe(instance: Instance, ok: bool, limits: Limits) -> bool:
    """Update the instance from one probe result; True when its routing state flipped."""
    if ok:
        instance.successes += 1
        instance.failures = 0
        if not instance.healthy and instance.successes >= limits.readmit_after:
            instance.healthy = True
            return True
        return False
    instance.failures += 1
    instance.successes = 0
    instance.engine_id = None  # a prefill that fails a probe may come back as a new engine: ask again
    if instance.healthy and instance.failures >= limits.evict_after:
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
        for instance, ok in zip(instances, results, strict=True):
            if apply_probe(instance, ok, self._limits):
                if instance.healthy:
                    log.info("%s %s admitted (its /health answers)", instance.role.value, instance.url)
                else:
                    log.warning(
                        "%s %s evicted after %d failed probes", instance.role.value, instance.url, instance.failures
                    )

    async def _probe(self, instance: Instance) -> bool:
        try:
            async with asyncio.timeout(self._timeouts.probe):
                status, _ = await self._backend.get(instance.url + "/health", role=instance.role.value)
        except (ProxyError, TimeoutError):
            return False
        return status == 200

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
