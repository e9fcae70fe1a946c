"""The real `epd-proxy` in front of the shared encoder and PD (real vLLM, CPU build, tiny Qwen2-VL): every answer
equals the single-instance baseline token for token (greedy), streamed and not, text only, one image, and
several images with a repeated one; the proxy's metrics and the EC folder prove the media went the transfer way
(encoded by the encoder under the proxy's uuid, sent to the PD as image_embeds references)."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import pytest

from epd_connectors.proxy.local import LocalProxy, local_proxy
from epd_connectors.proxy.media import content_uuid
from tests.e2e.conftest import SERVED_MODEL, TIMINGS, VllmInstance, greedy_chat, image_data_url
from tests.e2e.ec_example.conftest import Fleet

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

MAX_TOKENS = 12
Output = tuple[str, list[str]]
"""The generated text and its tokens as the server names them."""


@dataclass(frozen=True)
class Reply:
    """One HTTP answer, whatever its status."""

    status: int
    data: bytes
    seconds: float

    def json(self) -> Any:
        return json.loads(self.data)


def http(url: str, body: dict[str, Any] | bytes | None = None, timeout_s: float = 120.0) -> Reply:
    """GET (no body) or POST (JSON or raw bytes); the status and body, also for 4xx/5xx."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"}, method="GET" if body is None else "POST"
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return Reply(response.status, response.read(), time.monotonic() - started)
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, exc.read(), time.monotonic() - started)


def chat(content: str | list[dict[str, Any]], max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """A greedy chat request that always produces max_tokens tokens."""
    return greedy_chat(content, max_tokens)


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def sse_events(data: bytes) -> tuple[list[dict[str, Any]], bool]:
    """A stream's JSON events, and whether it ended with [DONE]."""
    events: list[dict[str, Any]] = []
    for line in data.decode().splitlines():
        if not line.startswith("data: "):
            continue
        payload = line.removeprefix("data: ").strip()
        if payload == "[DONE]":
            return events, True
        events.append(json.loads(payload))
    return events, False


def output_of(reply: Reply, stream: bool, what: str) -> Output:
    """The text and tokens of a chat or completions answer, streamed (joined chunks) or not."""
    assert reply.status == 200, f"{what}: HTTP {reply.status}: {reply.data[:2000]!r}"
    if not stream:
        choice = reply.json()["choices"][0]
        text = choice["message"]["content"] if "message" in choice else choice["text"]
        logprobs = choice.get("logprobs") or {}
        if "content" in logprobs:
            return str(text), [entry["token"] for entry in logprobs["content"] or []]
        return str(text), list(logprobs.get("tokens") or [])
    events, done = sse_events(reply.data)
    assert done, f"{what}: the stream ended without [DONE]: {events[-3:]}"
    text, tokens = "", []
    for event in events:
        assert "error" not in event, f"{what}: error event {event}"
        for choice in event.get("choices", []):
            text += (choice.get("delta") or {}).get("content") or choice.get("text") or ""
            logprobs = choice.get("logprobs") or {}
            if "content" in logprobs:
                tokens += [entry["token"] for entry in logprobs["content"] or []]
            else:
                tokens += list(logprobs.get("tokens") or [])
    return text, tokens


def generate(url: str, body: dict[str, Any], stream: bool, label: str, path: str = "/v1/chat/completions") -> Output:
    """POST to a vLLM instance or the proxy, timed under `label`."""
    reply = http(url + path, {**body, "stream": stream})
    TIMINGS.add(f"request {label}", reply.seconds)
    return output_of(reply, stream, label)


def baseline(instance: VllmInstance, body: dict[str, Any], label: str, path: str = "/v1/chat/completions") -> Output:
    return generate(instance.url, body, False, f"baseline {label}", path)


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")


class Served(Protocol):
    """What the metric readers need of a proxy: its base URL (a LocalProxy, or a proxy the local runner started)."""

    @property
    def url(self) -> str: ...


def metric(proxy: Served, name: str, **labels: str) -> float:
    """The sum of the proxy's samples called `name` whose labels include `labels` (0 when there is none)."""
    total = 0.0
    for line in http(proxy.url + "/metrics").data.decode().splitlines():
        match = _SAMPLE.match(line)
        if match is None or match.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(match.group(3))
    return total


@dataclass
class Counts:
    """The proxy counters that show which way media went."""

    rewritten: float
    kept: float
    encoder_requests: float
    pd_requests: float

    @classmethod
    def read(cls, proxy: Served) -> Counts:
        return cls(
            rewritten=metric(proxy, "epd_proxy_media_items_total", result="rewritten"),
            kept=metric(proxy, "epd_proxy_media_items_total", result="kept"),
            encoder_requests=metric(proxy, "epd_proxy_backend_requests_total", role="encoder"),
            pd_requests=metric(proxy, "epd_proxy_backend_requests_total", role="pd"),
        )

    def since(self, before: Counts) -> Counts:
        return Counts(
            self.rewritten - before.rewritten,
            self.kept - before.kept,
            self.encoder_requests - before.encoder_requests,
            self.pd_requests - before.pd_requests,
        )


@pytest.fixture(scope="module")
def proxy(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalProxy]:
    """The real epd-proxy (its own process, loopback) in front of the fleet's encoder and PD."""
    started = time.monotonic()
    with local_proxy(
        encoders=[fleet.encoder.url], pd=[fleet.pd.url], log_dir=tmp_path_factory.mktemp("proxy-flow")
    ) as running:
        TIMINGS.add("start proxy (flow)", time.monotonic() - started)
        try:
            yield running
        finally:
            if running.process.poll() is not None:
                print(running.log())


def assert_through_proxy_equals(proxy: LocalProxy, body: dict[str, Any], expected: Output, label: str) -> None:
    """Not streamed and streamed, the proxy's answer is the baseline's, token for token."""
    assert generate(proxy.url, body, False, f"proxy {label}") == expected
    assert generate(proxy.url, body, True, f"proxy {label}, streamed") == expected


def test_text_only_through_the_proxy_equals_baseline_and_skips_the_encoder(fleet: Fleet, proxy: LocalProxy) -> None:
    body = chat("Hello, who are you?")
    expected = baseline(fleet.baseline, body, "text (proxy reference)")
    assert len(expected[1]) == MAX_TOKENS
    before = Counts.read(proxy)
    assert_through_proxy_equals(proxy, body, expected, "text")

    completion = {k: v for k, v in body.items() if k != "messages"} | {"prompt": "Once upon a time", "logprobs": 1}
    expected_completion = baseline(fleet.baseline, completion, "completion", "/v1/completions")
    for stream in (False, True):
        got = generate(proxy.url, completion, stream, f"proxy completion stream={stream}", "/v1/completions")
        assert got == expected_completion
    assert Counts.read(proxy).since(before) == Counts(0, 0, 0, 4), "text only must not touch the encoder"
    models = http(proxy.url + "/v1/models")
    assert models.status == 200 and [m["id"] for m in models.json()["data"]] == [SERVED_MODEL]


def test_one_image_through_the_proxy_equals_baseline_via_image_embeds(fleet: Fleet, proxy: LocalProxy) -> None:
    part = image_part(image_data_url(seed=11))
    body = chat([part, {"type": "text", "text": "Describe the image."}])
    expected = baseline(fleet.baseline, body, "one image (proxy reference)")
    before = Counts.read(proxy)
    assert_through_proxy_equals(proxy, body, expected, "one image")
    # Both requests had their image rewritten to an image_embeds reference (the PD got no pixels, only the
    # encoder's grid and the uuid), and the encoder stored the embedding under the proxy's content uuid.
    assert Counts.read(proxy).since(before) == Counts(rewritten=2, kept=0, encoder_requests=2, pd_requests=2)
    uuid = content_uuid("image_url", part)
    assert list(fleet.ec_folder.glob(f"{uuid}*/*")), f"no EC entry under the proxy's uuid {uuid}"


def test_several_images_with_a_repeat_through_the_proxy_equal_baseline(fleet: Fleet, proxy: LocalProxy) -> None:
    first, second = image_part(image_data_url(seed=12)), image_part(image_data_url(seed=13))
    body = chat([first, {"type": "text", "text": "Compare"}, second, {"type": "text", "text": "with"}, first])
    expected = baseline(fleet.baseline, body, "three images (proxy reference)")
    before = Counts.read(proxy)
    assert_through_proxy_equals(proxy, body, expected, "three images")
    # Three items per request rewritten; the two distinct images went to the one encoder as one batch.
    assert Counts.read(proxy).since(before) == Counts(rewritten=6, kept=0, encoder_requests=2, pd_requests=2)
    for part in (first, second):
        uuid = content_uuid("image_url", part)
        assert list(fleet.ec_folder.glob(f"{uuid}*/*")), f"no EC entry under the proxy's uuid {uuid}"
    # The output really depends on the images: swapping them changes it.
    swapped = chat([second, {"type": "text", "text": "Compare"}, first, {"type": "text", "text": "with"}, second])
    assert generate(proxy.url, swapped, False, "proxy three images swapped") != expected
