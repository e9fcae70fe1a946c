"""Traffic through a real-pod deployment's proxy while a test changes it, and the small reads the tests share."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from epd_connectors.config.roles import Role
from epd_operator.api import constants as c
from tests.e2e.conftest import TIMINGS, VllmInstance
from tests.e2e.pods.conftest import RealEPD
from tests.e2e.test_local_e_p_d import Tokens, ask, chat, image, text, tokens, total

LOAD: list[list[dict[str, Any]] | str] = [
    [image(31), text("What is this?")],
    "Say something.",
    [image(32), text("Go.")],
]
"""What the load sends, in turn."""
LOAD_CLIENT_TIMEOUT_S = 600.0
"""How long the load's client waits for an answer: the OpenAI Python client's default. The proxy's own stage
limits (300 s) are the authority on a request that takes too long, and its error names the stage; the load's
slowest answer is a figure of its own. On 2 slow cores a roll's new set answers its first requests while old
pods still serve and stop, and one answer took over 120 s (2026-12-05, AMD EPYC family 23)."""


@dataclass
class Load:
    """Requests sent one after another from a thread while a test changes the deployment."""

    epd: RealEPD
    expected: list[Tokens]
    contents: list[list[dict[str, Any]] | str] = field(default_factory=lambda: LOAD)
    """What it sends, in turn; `expected` holds the baseline's answer to each."""
    sent: int = 0
    failed: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    answers: list[tuple[int, Tokens]] = field(default_factory=list)
    """(index into LOAD, the answer) of every request answered."""
    last_ok: float = 0.0
    outage_s: float = 0.0
    """The longest time between two successful requests."""
    slowest_s: float = 0.0
    """The longest time one request took, answered or not."""
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        self.last_ok = time.monotonic()
        while not self._stop.is_set():
            content = self.contents[self.sent % len(self.contents)]
            want = self.expected[self.sent % len(self.contents)]
            self.sent += 1
            began = time.monotonic()
            failure = None
            try:
                got = ask(self.epd.endpoint, chat(content), LOAD_CLIENT_TIMEOUT_S)
            except urllib.error.HTTPError as error:  # the proxy's answer: its body names the stage and instance
                failure = f"HTTP {error.code} (retry-after {error.headers.get('retry-after')}): {error.read()[:500]!r}"
            except (urllib.error.URLError, OSError, json.JSONDecodeError) as error:
                failure = str(error)
            now = time.monotonic()
            self.slowest_s = max(self.slowest_s, now - began)
            if failure is not None:
                self.failed.append(f"{time.strftime('%H:%M:%S')} {failure}")
                time.sleep(0.5)
                continue
            self.outage_s = max(self.outage_s, now - self.last_ok)
            self.last_ok = now
            self.answers.append(((self.sent - 1) % len(self.contents), got))
            if got != want:
                self.wrong.append(f"{content!r}: {got}")

    def stop(self) -> None:
        self._stop.set()

    def report(self, label: str) -> None:
        """Its figures in the timeline, under `label` (what the test changed)."""
        TIMINGS.count(f"real pods: {label}: failed of {self.sent} requests", len(self.failed))
        TIMINGS.add(f"real pods: {label}: longest gap between answers", self.outage_s)
        TIMINGS.add(f"real pods: {label}: slowest request", self.slowest_s)


@contextlib.contextmanager
def loads(
    epd: RealEPD, baseline: VllmInstance, contents: list[list[dict[str, Any]] | str] | None = None, count: int = 1
) -> Iterator[list[Load]]:
    """`count` clients, each sending `contents` (LOAD) in turn from a thread, every answer checked against the
    baseline's; stopped on the way out."""
    contents = LOAD if contents is None else contents
    expected = [tokens(baseline.post("/v1/chat/completions", chat(content))) for content in contents]
    running = [Load(epd, expected, contents) for _ in range(count)]
    threads = [threading.Thread(target=load.run, name=f"load-{i}", daemon=True) for i, load in enumerate(running)]
    for thread in threads:
        thread.start()
    try:
        yield running
    finally:
        for load in running:
            load.stop()
        for thread in threads:
            thread.join(timeout=300)


def patch(epd: RealEPD, spec: dict[str, Any]) -> None:
    epd.kubectl.run("patch", c.PLURAL, "-n", epd.namespace, epd.name, "--type=merge", "-p", json.dumps({"spec": spec}))


def pod_ready(pod: dict[str, Any]) -> bool:
    statuses = pod["status"].get("containerStatuses") or []
    return bool(statuses) and all(s["ready"] for s in statuses)


def roster(epd: RealEPD, role: str) -> float:
    return total(epd.metrics(Role.PROXY), "epd_proxy_roster_instances", role=role, state="healthy")
