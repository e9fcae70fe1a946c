"""Canaries: a tiny request over each transfer path the proxy routes, so a path that cannot carry data leaves
routing before a user request is sent over it.

A pod is Ready when its process answers. That does not say an encoder's push reaches its consumer (a
NetworkPolicy, a firewall, a wrong ec_ip) or that a prefill's KV reaches its decode, and such a request fails
only after the consumer's push_wait_timeout_s, with nothing in any log. So every pair the proxy may route
through (encoder -> EC consumer; prefill -> decode) gets a canary through the real request path (`Flow.through`)
with both of its instances fixed: a fresh random image (an audio clip for an audio-only model), so no cache can
answer in place of the transfer, and one token. A pair that fails `Canary.failures` canaries in a row leaves
routing (`Roster.failing`) until one passes again, as long as another pair can take its requests (a request
with no other way is still sent).
New pairs are checked at once, working ones every `interval_s`, failing ones from `retry_s` on.
`report` is what /health shows of each pair.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import struct
import time
import zlib
from base64 import b64encode
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

from epd_connectors.config.bundle import CanaryMedia
from epd_connectors.config.roles import Role
from epd_connectors.proxy.errors import ProxyError, StageTimeoutError
from epd_connectors.proxy.flow import ClientRequest, Flow, Route
from epd_connectors.proxy.roster import Instance, Roster
from epd_connectors.proxy.settings import Canary

log = logging.getLogger(__name__)

IMAGE_SIDE = 56
"""Pixels per side of a canary's image: Qwen-VL's smallest input (min_pixels 56*56), a handful of tokens."""
AUDIO_RATE = 16000
"""Samples per second of a canary's clip: Whisper-style audio encoders' rate, so vLLM resamples nothing (its
resampler needs torchaudio, which a CPU image may lack)."""
AUDIO_SAMPLES = AUDIO_RATE // 2
"""Half a second of mono 16-bit noise: a dozen audio tokens."""
PROMPT_WORDS = 48
"""Random words in a KV canary's prompt: more than one KV block (32 tokens on the CPU), so a block transfers."""
REQUEST_ID_PREFIX = "epd-canary-"
WHOLE_LIMIT_STAGES = 3
"""A canary's whole time limit, in stage limits: encode, prefill, decode."""
TICK_S = 1.0
"""Seconds between looks for due pairs (a look costs a walk over the pairs, nothing sent)."""


class TransferPath(StrEnum):
    EC = "ec"
    """An encoder's push of embeddings to an EC consumer (prefill, or PD)."""
    KV = "kv"
    """A prefill's KV cache to a decode."""


class Pair(NamedTuple):
    path: TransferPath
    sender: str
    """Base URL of the encoder or prefill."""
    receiver: str
    """Base URL of the EC consumer or decode."""


@dataclass(slots=True)
class PairState:
    """What the canaries of one pair found."""

    failures: int = 0
    """Consecutive failed canaries."""
    failing: bool = False
    """Out of routing: `Canary.failures` canaries in a row failed, and none passed since."""
    checked: bool = False
    latency_s: float = 0.0
    """Of the last canary, passed or failed."""
    error: str = ""
    """Why the last canary failed; empty once one passed."""
    checked_at: float = 0.0
    """time.monotonic() of the last canary."""

    @property
    def verdict(self) -> str:
        """ok, failing (out of routing) or unchecked."""
        return "failing" if self.failing else ("ok" if self.checked else "unchecked")


def pairs_of(roster: Roster) -> list[Pair]:
    """Every pair routing may use now: healthy senders with healthy receivers of the same model revision (pure)."""

    def healthy(role: Role) -> list[Instance]:
        return [i for i in roster.instances(role) if i.healthy]

    def paired(path: TransferPath, senders: list[Instance], receivers: list[Instance]) -> list[Pair]:
        return [
            Pair(path, s.url, r.url)
            for s in senders
            for r in receivers
            if not roster.revisions or roster.revision_of(s) == roster.revision_of(r)
        ]

    pairs = []
    if Role.ENCODER in roster.roles:
        pairs += paired(TransferPath.EC, healthy(Role.ENCODER), healthy(roster.consumer_role))
    if roster.split:
        pairs += paired(TransferPath.KV, healthy(Role.PREFILL), healthy(Role.DECODE))
    return pairs


def is_due(state: PairState | None, now: float, canary: Canary) -> bool:
    """Whether a pair needs a canary now: never checked, or its last result is older than its period. A
    failing pair's period doubles from `retry_s` up to `interval_s`: an encoder ties up a thread for each push
    that cannot get through (for up to a few control_timeout_s), so a dead path is not hammered."""
    if state is None or not state.checked:
        return True
    period = canary.interval_s
    if state.failures:
        period = min(period, canary.retry_s * 2 ** min(state.failures - 1, 16))
    return now - state.checked_at >= period


def record(state: PairState, error: str | None, latency_s: float, now: float, canary: Canary) -> bool:
    """Update `state` with one canary's result (None: passed); True when the pair left or rejoined routing."""
    was = state.failing
    state.checked, state.latency_s, state.checked_at = True, latency_s, now
    if error is None:
        state.failures, state.failing, state.error = 0, False, ""
    else:
        state.failures += 1
        state.error = error
        state.failing = state.failing or state.failures >= canary.failures
    return state.failing != was


def png(side: int, pixels: bytes) -> bytes:
    """An RGB PNG of `side` x `side` from `pixels` (3 bytes each, row by row), no filter (pure)."""
    rows = b"".join(b"\0" + pixels[y * side * 3 : (y + 1) * side * 3] for y in range(side))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def wav(rate: int, samples: bytes) -> bytes:
    """A mono 16-bit PCM WAV of `samples` (2 bytes each, little-endian) at `rate` per second (pure)."""
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(samples)) + samples
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


def media_part(media: CanaryMedia, noise: bytes) -> dict[str, Any]:
    """One chat content part of random media built from `noise`."""
    if media == "audio":
        clip = b64encode(wav(AUDIO_RATE, noise[: AUDIO_SAMPLES * 2])).decode()
        return {"type": "input_audio", "input_audio": {"data": clip, "format": "wav"}}
    image = b64encode(png(IMAGE_SIDE, noise[: IMAGE_SIDE * IMAGE_SIDE * 3])).decode()
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}}


def canary_body(path: TransferPath, noise: bytes, media: CanaryMedia = "image") -> dict[str, Any]:
    """A canary's chat request: for EC, random media (nothing has its embedding yet); for KV, a prompt of random
    words (no prefix cache holds its blocks). One token, greedy; `noise` is the randomness."""
    if path is TransferPath.EC:
        content: Any = [media_part(media, noise), {"type": "text", "text": "canary"}]
    else:
        content = " ".join(noise[i : i + 3].hex() for i in range(0, PROMPT_WORDS * 3, 3))
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 1, "temperature": 0}


def noise_bytes() -> bytes:
    return os.urandom(max(IMAGE_SIDE * IMAGE_SIDE * 3, AUDIO_SAMPLES * 2))


class Canaries:
    """Runs the canaries and keeps their results; `Roster.failing` follows them."""

    def __init__(self, roster: Roster, flow: Flow, canary: Canary) -> None:
        self._roster = roster
        self._flow = flow
        self._canary = canary
        self.states: dict[Pair, PairState] = {}
        self._task: asyncio.Task[None] | None = None
        self._running: dict[Pair, asyncio.Task[None]] = {}
        self._counter = 0

    def _start_due(self) -> None:
        """Start a canary for each due pair that has none running (each a task of its own: a slow canary must
        not hold up a new pair's); forget pairs that left the roster."""
        pairs = pairs_of(self._roster)
        self.states = {pair: self.states.get(pair) or PairState() for pair in pairs}
        self._sync()
        now = time.monotonic()
        for pair in pairs:
            if pair not in self._running and is_due(self.states[pair], now, self._canary):
                task = asyncio.create_task(self.check(pair), name=f"epd-proxy-canary-{pair.path}")
                task.add_done_callback(functools.partial(self._finished, pair))
                self._running[pair] = task

    def _finished(self, pair: Pair, _: asyncio.Task[None]) -> None:
        self._running.pop(pair, None)

    def _sync(self) -> None:
        self._roster.failing = frozenset((p.sender, p.receiver) for p, s in self.states.items() if s.failing)

    async def check(self, pair: Pair) -> None:
        """One canary over `pair`, its result recorded (a pair that left the roster meanwhile is not)."""
        started = time.monotonic()
        try:
            error = await self._send(pair)
        except _UnprovenError:
            return
        state = self.states.get(pair)
        if state is None:
            return
        if record(state, error, time.monotonic() - started, time.monotonic(), self._canary):
            self._sync()
            if state.failing:
                log.warning("%s %s -> %s fails its canaries; routed around while another pair serves: %s", *pair, error)
            else:
                log.warning("%s %s -> %s passed its canary; routed again", *pair)

    async def _send(self, pair: Pair) -> str | None:
        """None when the canary passed; else why not. _UnprovenError when it says nothing about the pair."""
        if pair.path is TransferPath.EC:
            consumer_url, receiver_role, route = pair.receiver, self._roster.consumer_role, Route(encoder=pair.sender)
            if self._roster.split:
                # An EC canary into a prefill runs on to a decode: that KV pair is another canary's business.
                route = route._replace(decode=self._any_decode(pair.receiver))
        else:
            consumer_url, receiver_role, route = pair.sender, Role.DECODE, Route(decode=pair.receiver)
        consumer = self._roster.get(self._roster.consumer_role, consumer_url)
        if consumer is None or (self._roster.split and route.decode is None):
            raise _UnprovenError
        self._counter += 1
        request = ClientRequest(
            "/v1/chat/completions",
            canary_body(pair.path, noise_bytes(), self._canary.media),
            f"{REQUEST_ID_PREFIX}{os.getpid():x}-{self._counter}",
        )
        answer = None
        try:  # each stage has the canary's time limit (the app's canary flow); this bounds the whole
            async with asyncio.timeout(self._canary.timeout_s * WHOLE_LIMIT_STAGES):
                answer = await self._flow.through(request, consumer, route)
        except TimeoutError:
            return f"no answer within {self._canary.timeout_s * WHOLE_LIMIT_STAGES} s"
        except StageTimeoutError as exc:
            if pair.path is TransferPath.EC and exc.role_of_failure is Role.DECODE:
                raise _UnprovenError from exc
            return f"{exc.message}: the {receiver_role.value} waits for a transfer that does not arrive"
        except ProxyError as exc:
            if pair.path is TransferPath.EC and exc.role_of_failure is Role.DECODE:
                raise _UnprovenError from exc  # the push worked; the decode after it is another pair's business
            return exc.message
        finally:
            if answer is not None:
                answer.close()
        if answer.status != 200:
            return f"{pair.receiver} answered {answer.status}"
        return None

    def _any_decode(self, prefill: str) -> str | None:
        """A decode of the prefill's revision that its KV reaches, for an EC canary that must run on to one."""
        avoid = self._roster.failing_receivers(prefill)
        sender = self._roster.get(Role.PREFILL, prefill)
        if self._roster.revisions and sender is not None:
            avoid |= self._roster.of_other_revisions(Role.DECODE, self._roster.revision_of(sender))
        decodes = [i.url for i in self._roster.instances(Role.DECODE) if i.healthy and i.url not in avoid]
        return decodes[self._counter % len(decodes)] if decodes else None

    def verdicts(self) -> list[tuple[str, str]]:
        """(path, verdict) of each pair, for the metrics (no report built per scrape)."""
        return [(pair.path.value, state.verdict) for pair, state in self.states.items()]

    def report(self) -> list[dict[str, Any]]:
        """Each pair's last result, for /health (names are the pods' where discovery knows them)."""
        now = time.monotonic()
        return [_entry(self._roster, pair, state, now) for pair, state in self.states.items()]

    def start(self) -> None:
        if self._canary.on:
            self._task = asyncio.create_task(self._loop(), name="epd-proxy-canaries")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._running.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._task = None

    async def _loop(self) -> None:
        """Look for due pairs every TICK_S: a new or readmitted instance's pairs are checked within it."""
        while True:
            try:
                self._start_due()
            except Exception:  # a canary loop that dies would freeze Roster.failing; log and go on
                log.exception("starting canaries failed")
            await asyncio.sleep(TICK_S)


class _UnprovenError(Exception):
    """A canary that says nothing about its pair (its instance left, or a later stage failed): not recorded."""


def _name(roster: Roster, url: str, roles: Iterable[Role]) -> str:
    for role in roles:
        instance = roster.get(role, url)
        if instance is not None:
            return instance.spec.name
    return ""


def _entry(roster: Roster, pair: Pair, state: PairState, now: float) -> dict[str, Any]:
    senders = (Role.ENCODER,) if pair.path is TransferPath.EC else (Role.PREFILL,)
    receivers = (roster.consumer_role,) if pair.path is TransferPath.EC else (Role.DECODE,)
    entry: dict[str, Any] = {
        "path": pair.path.value,
        "from": pair.sender,
        "to": pair.receiver,
        "from_role": senders[0].value,
        "to_role": receivers[0].value,
        "from_pod": _name(roster, pair.sender, senders),
        "to_pod": _name(roster, pair.receiver, receivers),
        "state": state.verdict,
        "failures": state.failures,
        "error": state.error,
    }
    if state.checked:
        entry["latency_ms"] = round(state.latency_s * 1000, 1)
        entry["age_s"] = round(now - state.checked_at, 1)
    return entry
