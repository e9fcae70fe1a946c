"""Kubernetes Events on an EPDDeployment, posted by the operator itself, in order, one at a time.

Not kopf's poster: it retries a refused post nine times with backoff, and in a namespace being deleted every post
is refused (NamespaceTerminating) or finds the namespace gone. Such an Event has no reader, so it is dropped at
once; a busy server gets a few retries; any other refusal is logged and dropped (Events are auxiliary).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import socket
from typing import Any, Final

from epd_operator import _kube
from epd_operator.api import constants as c
from epd_operator.api.resource import Owner

log = logging.getLogger(__name__)

MESSAGE_MAX: Final = 1000
"""The API server refuses longer Event messages (1024 bytes); room for a multi-byte character or two."""
RETRY_DELAYS_S: Final = (1.0, 3.0, 9.0)
"""Waits before retrying a post the server refused as busy."""


def event_body(level: str, owner: Owner, reason: str, message: str, now: datetime.datetime) -> dict[str, Any]:
    """A core/v1 Event on `owner` (level "warn" is a Warning, anything else Normal); pure."""
    stamp = now.isoformat()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{owner.name}.", "namespace": owner.namespace},
        "involvedObject": {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND,
            "name": owner.name,
            "namespace": owner.namespace,
            "uid": owner.uid,
        },
        "type": "Warning" if level == "warn" else "Normal",
        "reason": reason,
        "message": message[:MESSAGE_MAX],
        "source": {"component": c.MANAGED_BY},  # the "From" column of kubectl describe
        "reportingComponent": c.MANAGED_BY,
        "reportingInstance": socket.gethostname(),
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class EventPoster:
    """Posts Events in the order they were asked for, from one task started on first use."""

    def __init__(self, client: _kube.Requester) -> None:
        self._client = client
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None

    def post(self, level: str, owner: Owner, reason: str, message: str) -> None:
        """Queue an Event (returns at once; call from the event loop)."""
        self._queue.put_nowait(event_body(level, owner, reason, message, datetime.datetime.now(datetime.UTC)))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())

    async def drained(self) -> None:
        """Until every queued Event was posted or dropped."""
        await self._queue.join()

    async def _drain(self) -> None:
        while True:
            body = await self._queue.get()
            try:
                await self._post(body)
            finally:
                self._queue.task_done()

    async def _post(self, body: dict[str, Any]) -> None:
        namespace = body["metadata"]["namespace"]
        for delay in (*RETRY_DELAYS_S, None):
            try:
                await self._client.request("POST", f"/api/v1/namespaces/{namespace}/events", body=body)
                return
            except (_kube.NamespaceTerminatingError, _kube.NotFoundError):
                log.debug("%s: the namespace is going; Event %s dropped", namespace, body["reason"])
                return
            except _kube.UnavailableError as exc:
                if delay is None:
                    log.warning("%s: Event %s not posted: %s", namespace, body["reason"], exc)
                    return
                await asyncio.sleep(delay)
            except _kube.KubeError as exc:
                log.warning("%s: Event %s not posted: %s", namespace, body["reason"], exc)
                return
