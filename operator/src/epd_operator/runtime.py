"""What one operator process holds for its reconcile passes: the client, settings and metrics, the watches'
caches (`world`), the readers (`polls`), what it last applied and how often it may repair, and its Events.

The passes (module reconcile) use it; only the world is written from outside them, by the watches and readers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from epd_operator import _kube, apply, events, pacing
from epd_operator.api.resource import Owner
from epd_operator.metrics import Metrics
from epd_operator.polling import Polls
from epd_operator.settings import Settings
from epd_operator.world import World

PostEvent = Callable[[str, Owner, str, str], None]
"""(level "info" or "warn", the EPDDeployment, reason, message): posts a Kubernetes Event."""


@dataclass
class Runtime:
    client: _kube.Client
    settings: Settings
    metrics: Metrics
    world: World
    polls: Polls
    applied: apply.Applied = field(default_factory=apply.Applied)
    pacer: pacing.Pacer = field(default_factory=pacing.Pacer)
    syncs: asyncio.Semaphore = field(init=False)
    """Fifty syncs at once all finish late (their requests interleave); a few at a time finish one after another,
    so the pods of the first start while the rest are still being applied. Status writes never wait for it."""
    post_event: PostEvent = field(init=False)

    def __post_init__(self) -> None:
        self.syncs = asyncio.Semaphore(self.settings.concurrent_reconciles)
        self.events = events.EventPoster(self.client)
        self.post_event = self.events.post

    def event(self, owner: Owner, level: str, reason: str, message: str) -> None:
        self.post_event(level, owner, reason, message)
