"""The encode stage: every media item of a request to an encoder, concurrently, before the consumer sees it.

Items are placed by consistent hashing of their uuid (or least-outstanding when affinity is off), grouped per
encoder into batches of at most `encoder_batch_max`, and sent at once. A batch whose encoder fails before
answering (connect error, 5xx, timeout) is sent again, item by item to each item's next encoder, a bounded
number of times; an encoder that cannot be reached leaves routing until a health probe passes. An item named by
a URL that every encoder tried answered 5xx for is the request's fault (MediaUnavailableError, 422), not a
failure of the encoders.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from epd_connectors.config.roles import Role
from epd_connectors.proxy import routing
from epd_connectors.proxy.backend import Backend
from epd_connectors.proxy.errors import (
    BackendUnavailableError,
    MediaUnavailableError,
    NoInstanceError,
    ProxyError,
    StageTimeoutError,
    answered_5xx,
    unexpected,
)
from epd_connectors.proxy.media import MediaItem, fetched_url
from epd_connectors.proxy.metrics import ProxyMetrics
from epd_connectors.proxy.rewrite import Encoded, EncoderBatch, batches, encoder_body, parse_encoder_answer
from epd_connectors.proxy.roster import Instance, Outstanding, Roster
from epd_connectors.proxy.settings import ProxyOptions

ROLE = Role.ENCODER


def record_failure(instance: Instance | None, error: ProxyError, metrics: ProxyMetrics, evict_after: int) -> None:
    """Count a failed backend request; an unreachable instance leaves routing until a probe passes."""
    if instance is None:
        return
    metrics.backend_errors.labels(instance.role.value, instance.url, error.kind).inc()
    if isinstance(error, BackendUnavailableError) and error.unreachable:
        instance.healthy = False
        instance.successes = 0
        instance.engine_id = None
        instance.failures = max(instance.failures, evict_after)


class EncodeStage:
    """Sends a request's media to the encoders; the results say which items may be rewritten."""

    def __init__(self, roster: Roster, backend: Backend, options: ProxyOptions, metrics: ProxyMetrics) -> None:
        self._roster = roster
        self._backend = backend
        self._options = options
        self._metrics = metrics
        self._tiebreak = 0

    async def run(
        self,
        request: Mapping[str, Any],
        items: Sequence[MediaItem],
        consumer_zmq: str | None,
        request_id: str,
        avoid: frozenset[str] = frozenset(),
    ) -> tuple[dict[str, Encoded], dict[str, str]]:
        """Per uuid, what its encoder reported; and per uuid its push transfer id (push connectors only).
        No item goes to an encoder in `avoid` (its push does not reach this consumer)."""
        started = time.perf_counter()
        encoded: dict[str, Encoded] = {}
        transfer_ids: dict[str, str] = {}
        unique = list({item.uuid: item for item in items}.values())
        tried: dict[str, set[str]] = {item.uuid: set(avoid) for item in unique}
        answered = {item.uuid: True for item in unique}  # every encoder tried answered 5xx (none failed on the way)
        pending = unique
        last_error: ProxyError | None = None
        for attempt in range(self._options.limits.retries + 1):
            assignment = [(item, self._place(item, frozenset(tried[item.uuid]), attempt == 0)) for item in pending]
            missing = [item for item, encoder in assignment if encoder is None]
            if missing:
                if last_error is None:
                    raise NoInstanceError("no healthy encoder to send the request's media to")
                raise _giving_up(missing, last_error, answered)
            plan = batches(
                [(item, encoder) for item, encoder in assignment if encoder is not None],
                self._options.limits.encoder_batch_max,
            )
            results = await asyncio.gather(
                *(self._send(request, batch, consumer_zmq, request_id) for batch in plan), return_exceptions=True
            )
            pending = []
            for batch, result in zip(plan, results, strict=True):
                if isinstance(result, BaseException):
                    error = self._failed(batch, result)
                    last_error = error
                    pending.extend(batch.items)
                    for item in batch.items:
                        tried[item.uuid].add(batch.encoder)
                        answered[item.uuid] = answered[item.uuid] and answered_5xx(error)
                    continue
                encoded.update(result)
                if consumer_zmq is not None:
                    transfer_ids.update((i.uuid, t) for i, t in zip(batch.items, batch.transfer_ids, strict=True))
            if not pending:
                break
        if pending:
            assert last_error is not None
            raise _giving_up(pending, last_error, answered)
        self._metrics.observe_stage("encode", time.perf_counter() - started)
        return encoded, transfer_ids

    def _place(self, item: MediaItem, exclude: frozenset[str], first: bool) -> str | None:
        candidates = self._roster.candidates(ROLE)
        if self._options.encoder_affinity:
            chosen = routing.pick_encoder(item.uuid, candidates, exclude)
            if chosen is not None and first:
                self._metrics.affinity_result(routing.is_affinity_hit(item.uuid, candidates, chosen))
            return chosen
        self._tiebreak += 1
        return routing.least_outstanding(candidates, exclude, self._tiebreak)

    def _failed(self, batch: EncoderBatch, exc: BaseException) -> ProxyError:
        """Our error for a failed batch; re-raised at once unless another encoder may do better."""
        if not isinstance(exc, Exception):
            raise exc  # cancelled: the client went away
        error = exc if isinstance(exc, ProxyError) else unexpected(exc, f"encoder {batch.encoder}")
        record_failure(self._roster.get(ROLE, batch.encoder), error, self._metrics, self._options.limits.evict_after)
        if not error.retryable and not isinstance(error, StageTimeoutError):
            raise error
        self._metrics.retries.labels(ROLE.value, batch.encoder).inc()
        return error

    async def _send(
        self, request: Mapping[str, Any], batch: EncoderBatch, consumer_zmq: str | None, request_id: str
    ) -> dict[str, Encoded]:
        instance = self._roster.get(ROLE, batch.encoder)
        if instance is None:
            raise BackendUnavailableError(f"encoder {batch.encoder} left the roster", unreachable=True)
        body = encoder_body(request, batch, consumer_zmq)
        headers = {"x-request-id": f"{request_id}-enc-{batch.transfer_ids[0][:8]}"}
        self._metrics.count_backend(ROLE.value, instance.url)
        with Outstanding(instance):
            try:
                async with asyncio.timeout(self._options.timeouts.encode):
                    answer = await self._backend.post_json(
                        f"{instance.url}/v1/chat/completions", body, role="encoder", headers=headers
                    )
            except TimeoutError as exc:
                raise StageTimeoutError(
                    f"encoder {instance.url} took longer than {self._options.timeouts.encode} s"
                ) from exc
        return parse_encoder_answer(answer, batch, instance.url)


def _giving_up(items: Sequence[MediaItem], last: ProxyError, answered: Mapping[str, bool]) -> ProxyError:
    """The error for items no encoder could encode. A URL every encoder tried answered 5xx for is the media's
    fault: vLLM retried the fetch already (VLLM_MEDIA_FETCH_MAX_RETRIES), so the client gets a 4xx saying which
    item, not a 502 that invites it to send the same URL again. Anything else is the encoders' failure."""
    for item in items:
        url = fetched_url(item)
        if url is not None and answered[item.uuid]:
            shown = url if len(url) <= 200 else url[:200] + "..."
            return MediaUnavailableError(
                f"{item.where}: the encoders could not load the {item.type} {shown!r} ({last.message}). "
                "Fix: give a URL the serving side can reach, or send the content inline as a data URL"
            )
    return last
