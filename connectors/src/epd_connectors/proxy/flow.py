"""One client request through the roles: encode -> (prefill) -> decode or PD, with bounded retries.

The consumer of encoder output (prefill in a split, else PD) is chosen first, because a push connector's
encoder must be told where to push (`consumer_zmq`, one address per data-parallel replica). A failure before
the first byte reached the client moves the request to another instance of the failing role; retrying a
consumer re-runs the encode stage when the encoder pushed to the failed one. The answer is either complete or a
stream whose first chunk already arrived, so nothing is committed to the client before the retries are over.
A roll retires a model revision's set while requests are on it: a request whose set fails under it (its pods
stopping: refused, reset, 5xx, gone from the roster) before the first byte runs again, once, on the set that
took over, so the set's pods going never fails a request there was another set to serve.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from epd_connectors.config.bundle import KVProtocol
from epd_connectors.config.roles import Role
from epd_connectors.proxy import kv, routing
from epd_connectors.proxy.backend import Backend, BackendResponse, loads
from epd_connectors.proxy.deadlines import Deadlines
from epd_connectors.proxy.encode import EncodeStage, record_failure
from epd_connectors.proxy.errors import (
    BackendUnavailableError,
    NoInstanceError,
    ProxyError,
    StageTimeoutError,
)
from epd_connectors.proxy.media import MediaItem, find_media
from epd_connectors.proxy.metrics import ProxyMetrics
from epd_connectors.proxy.rewrite import consumer_body, new_transfer_id, references, with_uuids
from epd_connectors.proxy.roster import Instance, Outstanding, Roster
from epd_connectors.proxy.settings import ProxyOptions

_T = TypeVar("_T")
log = logging.getLogger(__name__)

DP_RANK_HEADER = "X-data-parallel-rank"
"""vLLM's header naming the data-parallel replica that must serve a request (the one the encoder pushed to)."""
REVISION_WAIT_S = 30.0
"""How long a request waits for a model revision with a whole healthy set (a roll's switch takes milliseconds;
a set being replaced by hand takes its pods' start)."""
REVISION_POLL_S = 0.05
ENCODER_POLL_S = 0.05
"""How often a media request held for an encoder (encoders at zero) looks at the roster."""


class Route(NamedTuple):
    """Instances a canary fixes (module canary): the encoder of its media, the decode of its KV; None: routed."""

    encoder: str | None = None
    decode: str | None = None


NO_ROUTE = Route()


@dataclass(slots=True)
class ClientRequest:
    """What the app parsed from the client."""

    path: str
    """/v1/chat/completions or /v1/completions."""
    body: dict[str, Any]
    request_id: str
    raw: bytes = b""
    """The body as the client sent it: forwarded as is while the request goes on unchanged (no parse, no copy)."""

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream", False))


@dataclass(slots=True)
class Answer:
    """The generating instance's answer. `chunks` yields the rest of a stream after `first`; for a complete
    answer `first` is the whole body and `chunks` is empty. `close` releases the backend (always call it)."""

    status: int
    content_type: str
    first: bytes
    chunks: AsyncIterator[bytes] | None = None
    instance: str = ""
    _release: Callable[[], None] | None = None

    def close(self) -> None:
        if self._release is not None:
            self._release()
            self._release = None


class Flow:
    """Runs client requests against the roster."""

    def __init__(
        self, roster: Roster, backend: Backend, options: ProxyOptions, metrics: ProxyMetrics, deadlines: Deadlines
    ) -> None:
        self.roster = roster
        self.backend = backend
        self.options = options
        self.metrics = metrics
        self.deadlines = deadlines
        self.encode = EncodeStage(roster, backend, options, metrics)
        self._tiebreak = 0

    def run(self, request: ClientRequest) -> Awaitable[Answer]:
        """The answer to `request` (awaitable; not a coroutine of its own, which would be one more frame for
        every request's await chain to pass)."""
        return self._run(request, may_move=True)

    def _run(self, request: ClientRequest, *, may_move: bool) -> Awaitable[Answer]:
        """`run`; `may_move`: a failure of the revision's set may still move the request to the next set."""
        items = find_media(request.body, self.options.media) if request.path.endswith("/chat/completions") else []
        if items and Role.ENCODER not in self.roster.roles:
            items = []  # no encoder pool: the consumer encodes the media itself
        if items and Role.ENCODER in self.roster.optional and not self.roster.healthy(Role.ENCODER):
            return self._once_an_encoder_is_up(request, may_move=may_move)
        role = self.roster.consumer_role
        revision: str | None = None
        avoid: frozenset[str] = frozenset()
        if self.roster.revisions:
            revision = self.roster.routing_revision()
            if revision is None:
                return self._once_a_revision_is_whole(request, may_move=may_move)
            avoid = self.roster.of_other_revisions(role, revision)
        if items and self.roster.failing:
            avoid |= self._consumers_no_encoder_reaches(revision, avoid)
        if revision is not None and may_move:
            return self._on_revision(request, items, revision, avoid)
        return self._with_retries(role, lambda consumer: self._via_consumer(request, items, consumer), avoid)

    async def _once_a_revision_is_whole(self, request: ClientRequest, *, may_move: bool) -> Answer:
        """No model revision has a healthy instance of every role: the moment in a roll when one set's pods go
        while the other's are not all seen yet (each Service has its own watch). Wait for a whole set rather
        than mix revisions; give up after REVISION_WAIT_S."""
        if not await self._routing_revision_other_than(None):
            raise NoInstanceError(
                f"no model revision has a healthy instance of every role after {REVISION_WAIT_S:.0f} s "
                f"(requests never mix revisions): {self.roster.revision_summary()}"
            )
        return await self._run(request, may_move=may_move)

    async def _once_an_encoder_is_up(self, request: ClientRequest, *, may_move: bool) -> Answer:
        """Encoders are scaled to zero: hold the media request, counted in requests_waiting (what wakes them),
        until one is healthy, up to `encoder_wake_s`; then 503 with Retry-After. Text requests never wait."""
        loop = asyncio.get_running_loop()
        wake = self.options.encoder_wake_s
        deadline = loop.time() + wake
        waiting = self.metrics.requests_waiting.labels(Role.ENCODER.value)
        waiting.inc()
        try:
            while not self.roster.healthy(Role.ENCODER):
                if loop.time() > deadline:
                    raise NoInstanceError(
                        f"no encoder came up within {wake:.0f} s (the encoders were scaled to zero and are "
                        "starting); retry later"
                    )
                await asyncio.sleep(ENCODER_POLL_S)
        finally:
            waiting.dec()
        return await self._run(request, may_move=may_move)

    async def _on_revision(
        self, request: ClientRequest, items: list[MediaItem], revision: str, avoid: frozenset[str]
    ) -> Answer:
        """The request on `revision`'s set. When that set fails it before any byte reached the client while a
        newer revision has pods (a roll is retiring this set: its pods get SIGTERM as the new set turns Ready,
        with requests on them, and the proxy may see the new set a moment after), the request waits for the
        new set as a request arriving then would, and runs again there, once. The retries inside the set come
        first; a revision no newer set replaces fails as before, at once, and a request never moves back to an
        older set."""
        role = self.roster.consumer_role
        try:
            return await self._with_retries(role, lambda consumer: self._via_consumer(request, items, consumer), avoid)
        except ProxyError as error:
            if not (error.retryable or isinstance(error, NoInstanceError)) or not self.roster.superseded(revision):
                raise
            if not await self._routing_revision_other_than(revision):
                raise
            log.info(
                "request %s: revision %s failed it while being replaced (%s); running it on revision %s",
                request.request_id,
                revision,
                error.message,
                self.roster.routing_revision(),
            )
        return await self._run(request, may_move=False)

    async def _routing_revision_other_than(self, revision: str | None) -> bool:
        """Wait up to REVISION_WAIT_S for a whole set of a revision other than `revision` (None: any whole
        set); False when none came."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REVISION_WAIT_S
        while self.roster.routing_revision() in (None, revision):
            if loop.time() > deadline:
                return False
            await asyncio.sleep(REVISION_POLL_S)
        return True

    def through(self, request: ClientRequest, consumer: Instance, route: Route) -> Awaitable[Answer]:
        """`request` over fixed instances, without retries elsewhere (a canary): this consumer, and the route's
        encoder and decode."""
        items = find_media(request.body, self.options.media) if request.path.endswith("/chat/completions") else []
        return self._via_consumer(request, items, consumer, route)

    def _consumers_no_encoder_reaches(self, revision: str | None, elsewhere: frozenset[str]) -> frozenset[str]:
        """Consumers of `revision` (not in `elsewhere`, those of other revisions) that no healthy encoder of
        that revision pushes to: a media request goes to another consumer of the revision if it can."""
        encoders_elsewhere = (
            self.roster.of_other_revisions(Role.ENCODER, revision) if revision is not None else frozenset()
        )
        encoders = {i.url for i in self.roster.instances(Role.ENCODER) if i.healthy} - encoders_elsewhere
        consumers = [c for c in self.roster.instances(self.roster.consumer_role) if c.url not in elsewhere]
        avoid = frozenset(c.url for c in consumers if encoders and encoders <= self.roster.failing_senders(c.url))
        return self._unless_all(self.roster.consumer_role, avoid, elsewhere)

    def _unless_all(self, role: Role, avoid: frozenset[str], elsewhere: frozenset[str]) -> frozenset[str]:
        """`avoid`, unless it holds every healthy instance of `role` the request may use (all but `elsewhere`,
        those of other model revisions): a failing canary steers requests to a working pair, but never refuses
        one that has no other way (the canary may be the one that is wrong: a new set's first canaries run
        while its pods are still cold, and a request that fails anyway fails as it would have)."""
        if avoid and all(i.url in avoid for i in self.roster.instances(role) if i.healthy and i.url not in elsewhere):
            return frozenset()
        return avoid

    def _avoided(
        self, role: Role, pinned: str | None, failing: Callable[[str], frozenset[str]], consumer: Instance
    ) -> frozenset[str]:
        """The instances of `role` a stage after `consumer` must not use: all but the pinned one (a canary), else
        those of another model revision and those whose transfer with it fails (while another is left)."""
        if pinned is not None:
            return frozenset(i.url for i in self.roster.instances(role) if i.url != pinned)
        elsewhere = (
            self.roster.of_other_revisions(role, self.roster.revision_of(consumer))
            if self.roster.revisions
            else frozenset()
        )
        if not self.roster.failing:
            return elsewhere
        return elsewhere | self._unless_all(role, failing(consumer.url), elsewhere)

    async def _with_retries(
        self, role: Role, attempt: Callable[[Instance], Awaitable[Answer]], avoid: frozenset[str] = frozenset()
    ) -> Answer:
        """`attempt` on the least-loaded healthy instance of `role` not in `avoid`, then on others while the
        failure is retryable and attempts remain."""
        tried = avoid
        last: ProxyError | None = None
        for _ in range(self.options.limits.retries + 1):
            self._tiebreak += 1
            url = routing.least_outstanding(self.roster.candidates(role), tried, self._tiebreak)
            instance = self.roster.get(role, url) if url is not None else None
            if instance is None:
                if last is not None and any(c.healthy and c.key not in avoid for c in self.roster.candidates(role)):
                    raise last  # healthy instances are left, all tried: the last failure says why
                gone = f" (the last one failed: {last.message})" if last is not None else ""
                raise NoInstanceError(f"no healthy {role.value} instance{gone}") from last
            try:
                return await attempt(instance)
            except ProxyError as error:
                if error.role_of_failure not in (None, role):
                    raise
                record_failure(instance, error, self.metrics, self.options.limits.evict_after)
                if not error.retryable:
                    raise
                self.metrics.retries.labels(role.value, instance.url).inc()
                tried |= {instance.url}
                last = error
        assert last is not None
        raise last

    def _via_consumer(
        self, request: ClientRequest, items: list[MediaItem], consumer: Instance, route: Route = NO_ROUTE
    ) -> Awaitable[Answer]:
        """Encode for this consumer, then prefill+decode or PD. A text request to PD instances goes straight to
        `_generate` (the common case, without a coroutine frame of its own)."""
        dp_rank = routing.pick_dp_rank(max(1, len(consumer.spec.ec_addresses)), consumer.dp_counter)
        consumer.dp_counter += 1
        headers = {"x-request-id": request.request_id}
        if dp_rank is not None:
            headers[DP_RANK_HEADER] = str(dp_rank)
        if not items and not self.roster.split:
            return self._generate(request, consumer, request.raw or request.body, headers)
        zmq = consumer.spec.ec_addresses[dp_rank or 0] if consumer.spec.ec_addresses else None
        return self._encode_then_generate(request, items, consumer, zmq, headers, route=route)

    async def _encode_then_generate(
        self,
        request: ClientRequest,
        items: list[MediaItem],
        consumer: Instance,
        zmq: str | None,
        headers: dict[str, str],
        *,
        route: Route,
    ) -> Answer:
        body = request.body
        if items:
            encoders = self._avoided(Role.ENCODER, route.encoder, self.roster.failing_senders, consumer)
            # Counted against the consumer while its media are encoded, so concurrent requests spread over
            # consumers from the start instead of all choosing the one that looked idle.
            with Outstanding(consumer):
                encoded, transfer_ids = await _as_role(
                    Role.ENCODER, self.encode.run(body, items, zmq, request.request_id, encoders)
                )
            body = consumer_body(body, items, encoded, transfer_ids)
            referenced = references(items, encoded)
            rewritten = sum(1 for item in items if item.uuid in referenced)
            self.metrics.media_items.labels("rewritten").inc(rewritten)
            self.metrics.media_items.labels("kept").inc(len(items) - rewritten)
        if not self.roster.split:
            forwarded = request.raw if body is request.body and request.raw else body
            return await self._generate(request, consumer, forwarded, headers)
        kv_params = await self._prefill(request, consumer, body, headers)
        decode_body = with_uuids(request.body, items)
        if kv_params is not None:
            decode_body["kv_transfer_params"] = kv_params
        decodes = self._avoided(Role.DECODE, route.decode, self.roster.failing_receivers, consumer)
        return await _as_role(
            Role.DECODE,
            self._with_retries(
                Role.DECODE,
                lambda d: self._generate(request, d, decode_body, {"x-request-id": request.request_id}),
                decodes,
            ),
        )

    async def _prefill(
        self, request: ClientRequest, prefill: Instance, body: Mapping[str, Any], headers: Mapping[str, str]
    ) -> dict[str, Any] | None:
        """One token on the prefill; the decode's kv_transfer_params."""
        protocol = self.options.kv_protocol
        transfer_id = new_transfer_id()
        engine_id = await self._engine_id(prefill) if protocol is KVProtocol.MOONCAKE else None
        started = time.perf_counter()
        self.metrics.count_backend(prefill.role.value, prefill.url)
        with Outstanding(prefill):
            try:
                with self.deadlines.limit(self.options.timeouts.prefill):
                    answer = await self.backend.post_json(
                        prefill.url + request.path,
                        kv.prefill_body(body, protocol, transfer_id),
                        role="prefill",
                        headers=headers,
                    )
            except TimeoutError as exc:
                raise StageTimeoutError(
                    f"prefill {prefill.url} took longer than {self.options.timeouts.prefill} s"
                ) from exc
        self.metrics.observe_stage("prefill", time.perf_counter() - started)
        returned = answer.get("kv_transfer_params") if isinstance(answer, Mapping) else None
        return kv.decode_params(
            protocol, transfer_id, bootstrap_addr=prefill.spec.bootstrap_url, engine_id=engine_id, returned=returned
        )

    async def _engine_id(self, prefill: Instance) -> str:
        """MooncakeConnector: the prefill's engine id from its bootstrap server, cached per instance."""
        if prefill.engine_id is not None:
            return prefill.engine_id
        if prefill.spec.bootstrap_url is None:
            raise NoInstanceError(f"prefill {prefill.url} has no bootstrap address; give --prefill-bootstrap-port")
        status, data = await self.backend.get(prefill.spec.bootstrap_url + "/query", role="prefill")
        engine_id = kv.engine_id_from_query(_json_or_none(data)) if status == 200 else None
        if engine_id is None:
            raise BackendUnavailableError(f"prefill bootstrap {prefill.spec.bootstrap_url}/query gave no engine id")
        prefill.engine_id = engine_id
        return engine_id

    async def _generate(
        self, request: ClientRequest, instance: Instance, body: Mapping[str, Any] | bytes, headers: Mapping[str, str]
    ) -> Answer:
        """Send to the decode/PD instance and wait for the first byte (streams) or the whole answer."""
        instance.outstanding += 1
        response: BackendResponse | None = None

        def release() -> None:
            instance.outstanding -= 1
            if response is not None:
                response.release()

        self.metrics.count_backend(instance.role.value, instance.url)
        started = time.perf_counter()
        limit = self.options.timeouts.first_token
        try:
            with self.deadlines.limit(limit):
                response = await self.backend.open(
                    instance.url + request.path, body, role=instance.role.value, headers=headers
                )
                if request.stream:
                    body_chunks = response.chunks().__aiter__()
                    first = await _first_chunk(body_chunks, response.url)
                else:
                    first = await response.read()
        except BaseException as exc:
            release()
            if isinstance(exc, TimeoutError):
                raise StageTimeoutError(f"{instance.role.value} {instance.url} sent nothing for {limit} s") from exc
            raise
        self.metrics.observe_stage("first_token", time.perf_counter() - started)
        chunks = _rest(body_chunks, response.url, limit, self.deadlines) if request.stream else None
        return Answer(response.status, response.content_type, first, chunks, instance.url, release)


async def _first_chunk(chunks: AsyncIterator[bytes], url: str) -> bytes:
    """The first non-empty chunk of a stream; a stream that ends before any byte counts as a failure."""
    async for chunk in chunks:
        if chunk:
            return chunk
    raise BackendUnavailableError(f"{url} closed the stream before sending anything")


async def _rest(
    chunks: AsyncIterator[bytes], url: str, idle_limit: float, deadlines: Deadlines
) -> AsyncIterator[bytes]:
    """The remaining chunks; waiting longer than `idle_limit` for the next one ends the stream with
    StageTimeoutError. The wait is a deadline in the request path's sweep, moved on every chunk (a clock read,
    not a timer: streams send one chunk per token); time spent sending to a slow client does not count."""
    task = asyncio.current_task()
    assert task is not None
    stall = deadlines.add(task, idle_limit)
    try:
        while True:
            stall.due = time.monotonic() + idle_limit
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                return
            except asyncio.CancelledError as exc:
                if stall.expired and task.uncancel() == 0:
                    raise StageTimeoutError(f"{url} stalled for {idle_limit} s mid-stream") from exc
                raise
            stall.due = math.inf
            if chunk:
                yield chunk
    finally:
        deadlines.discard(stall)


async def _as_role(role: Role, work: Awaitable[_T]) -> _T:
    """Tag errors from a nested stage with its role, so an outer retry loop does not blame its own instance."""
    try:
        return await work
    except ProxyError as error:
        if error.role_of_failure is None:
            error.role_of_failure = role
        raise


def _json_or_none(data: bytes) -> Any:
    try:
        return loads(data)
    except ValueError:
        return None
