"""The real `epd-proxy` in front of real vLLM (CPU build, tiny Qwen2-VL) when things go wrong: an encoder killed
while requests flow is routed around (every answer still equals the baseline); a hung or dead PD gives a clear
5xx within seconds, and a PD killed mid-stream ends the stream with an error event; a malformed request gets
400 with a message; media the encoder cannot load get a 4xx naming them, and the PD is unharmed.

Two instances of its own (started once for this module, stopped at its end): a second encoder, sharing the
fleet's EC folder, to be killed; and a plain PD to be frozen and killed. The fleet's instances are never
stopped, as the other modules share them; a dedicated PD costs no extra wall time because both spares start
together with the fleet when this module runs first (and together otherwise).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from epd_connectors.config.ec_transfer import ECExampleConnectorConfig
from epd_connectors.proxy.local import LocalProxy, local_proxy
from epd_connectors.proxy.media import content_uuid
from epd_connectors.proxy.routing import preference
from epd_connectors.proxy.settings import DEFAULT_SLOW_PROBE_GRACE_S
from tests.e2e.conftest import (
    TIMINGS,
    Launcher,
    VllmInstance,
    free_port,
    image_data_url,
    tiny_server,
    vllm_bundle,
)
from tests.e2e.ec_example.conftest import Fleet, fleet_ec_folder
from tests.e2e.ec_example.test_proxy_flow import (
    Output,
    baseline,
    chat,
    generate,
    http,
    image_part,
    metric,
    sse_events,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

FIRST_TOKEN_TIMEOUT_S = 8.0
"""The PD-down proxy's first-token limit: a frozen PD must cost the client this, not a hang (a warm PD answers
in 0.1 s when idle, but seconds on a loaded 2-core box)."""
PROBE_INTERVAL_S = 0.5
KILL_AT = 10
"""The encoder-kill test's request (of 16) before which the second encoder dies."""


@dataclass
class Spares:
    """This module's own instances, which its tests may kill."""

    encoder: VllmInstance
    pd: VllmInstance
    fleet: Fleet


@pytest.fixture(scope="module")
def spares(request: pytest.FixtureRequest, launcher: Launcher, tiny_model: Path) -> Iterator[Spares]:
    """A second encoder (an EC producer on the fleet's shared folder) and a plain PD, started before the fleet is
    asked for, so that all start at once when this module runs first; stopped at the module's end."""
    started = time.monotonic()
    # The fleet's EC folder, known before it starts; vLLM creates it on its first write.
    ec_folder = fleet_ec_folder(launcher)
    producer = ECExampleConnectorConfig(
        ec_role="ec_producer", ec_connector_extra_config={"shared_storage_path": str(ec_folder)}
    )
    encoder = launcher.start("encoder-2", vllm_bundle("encoder-2", tiny_server(tiny_model, "encoder"), producer))
    pd = launcher.start("pd-doomed", vllm_bundle("pd-doomed", tiny_server(tiny_model, "pd")))
    try:
        fleet: Fleet = request.getfixturevalue("fleet")
        assert fleet.ec_folder == ec_folder
        launcher.wait_healthy([encoder, pd])
        TIMINGS.add("start spares (wall, with the fleet if first)", time.monotonic() - started)
        yield Spares(encoder=encoder, pd=pd, fleet=fleet)
    finally:
        launcher.stop_each([encoder, pd])


def kill(instance: VllmInstance) -> None:
    """SIGKILL the instance's whole process group (API server and engine core): a crash, not a shutdown."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(instance.popen.pid, signal.SIGKILL)
    instance.popen.wait(timeout=30)


def test_encoder_killed_mid_run_is_routed_around(spares: Spares, tmp_path: Path) -> None:
    fleet = spares.fleet
    first, second = fleet.encoder.url, spares.encoder.url
    # Distinct images (each a new uuid, so a new encode), alternately ones the consistent hash gives to the
    # second encoder and to the first (ports are random, so the images are chosen per run): the former must move
    # once the second encoder is dead.
    chosen: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for seed in range(100, 1000):
        part = image_part(image_data_url(seed=seed))
        bucket = chosen[preference(content_uuid("image_url", part), [first, second])[0] == second]
        if len(bucket) < 8:
            bucket.append(part)
        if len(chosen[True]) == len(chosen[False]) == 8:
            break
    parts = [part for pair in zip(chosen[True], chosen[False], strict=True) for part in pair]
    prefers_second = [n % 2 == 0 for n in range(len(parts))]
    bodies = [chat([p, {"type": "text", "text": "What is this?"}]) for p in parts]
    started = time.monotonic()
    expected = [baseline(fleet.baseline, b, f"image {n} (kill reference)") for n, b in enumerate(bodies)]
    TIMINGS.add("kill test: 16 baseline answers", time.monotonic() - started)

    extra = ["--probe-interval", str(PROBE_INTERVAL_S)]
    with local_proxy(encoders=[first, second], pd=[fleet.pd.url], extra_args=extra, log_dir=tmp_path) as proxy:
        # Before the kill: both encoders serve (half the images, two clients at once).
        got: dict[int, Output] = {}
        with ThreadPoolExecutor(max_workers=2) as pool:
            for n, output in zip(range(8), pool.map(lambda n: ask(proxy, bodies[n], n), range(8)), strict=True):
                got[n] = output
        served_by_second = metric(proxy, "epd_proxy_backend_requests_total", role="encoder", instance=second)
        assert served_by_second > 0, "the second encoder should have had work before it was killed"

        # Kill the second encoder while the remaining requests flow: the worker that takes request 10 (an image
        # of the second encoder's, as are 12 and 14) kills it first, while the other worker has one in flight.
        def ask_or_kill(n: int) -> Output:
            if n == KILL_AT:
                kill(spares.encoder)
            return ask(proxy, bodies[n], n)

        with ThreadPoolExecutor(max_workers=2) as pool:
            rest = list(pool.map(ask_or_kill, range(8, 16)))
        got.update(zip(range(8, 16), rest, strict=True))
        assert not spares.encoder.alive()
        unhealthy = metric(proxy, "epd_proxy_roster_instances", role="encoder", state="unhealthy")
        assert unhealthy == 1, "the dead encoder should be out of routing"

        # Every request succeeded with the baseline's output, and the images meant for the dead encoder got
        # there by another way: a retry on the first encoder, or (once evicted) a second choice.
        assert got == dict(enumerate(expected))
        moved = metric(proxy, "epd_proxy_retries_total", role="encoder", instance=second) + metric(
            proxy, "epd_proxy_encoder_affinity_total", result="miss"
        )
        assert moved >= 1, proxy.log()
        again = [n for n, mine in enumerate(prefers_second) if mine][:2]  # encoded by the dead one before
        after = [ask(proxy, bodies[n], n) for n in again]
        assert after == [expected[n] for n in again]
        assert metric(proxy, "epd_proxy_requests_total", status="200") == 16 + len(after)
        assert metric(proxy, "epd_proxy_media_items_total", result="kept") == 0
        assert http(proxy.url + "/health").status == 200, "one encoder left is still a healthy proxy"


def ask(proxy: LocalProxy, body: dict[str, Any], n: int) -> Output:
    return generate(proxy.url, body, False, f"proxy image {n} (encoder kill)")


def test_malformed_requests_get_400_with_a_message(spares: Spares, tmp_path: Path) -> None:
    fleet = spares.fleet
    good = chat([image_part(image_data_url(seed=7)), {"type": "text", "text": "Hi"}])
    cases: dict[str, tuple[str, dict[str, Any] | bytes, str]] = {
        "not JSON": ("/v1/chat/completions", b"{not json", "not valid JSON"),
        "not an object": ("/v1/chat/completions", b"[1, 2]", "JSON object"),
        "no messages": ("/v1/chat/completions", {"model": "tiny-qwen2-vl"}, "messages"),
        "messages not a list": ("/v1/chat/completions", {**good, "messages": "hello"}, "messages"),
        "zero max_tokens": ("/v1/chat/completions", {**good, "max_tokens": 0}, "max_tokens"),
        "stream not a boolean": ("/v1/chat/completions", {**good, "stream": "yes"}, "stream"),
        "empty image": (
            "/v1/chat/completions",
            chat([{"type": "image_url", "image_url": {}}, {"type": "text", "text": "Hi"}]),
            "messages[0].content[0]",
        ),
        "metadata-only image_embeds": (
            "/v1/chat/completions",
            chat([{"type": "image_embeds", "image_embeds": {"image_grid_thw": [1, 4, 4]}, "uuid": "x"}]),
            "reserved for the proxy",
        ),
        "completion without prompt": ("/v1/completions", {"model": "tiny-qwen2-vl", "max_tokens": 4}, "prompt"),
        # Refused by vLLM itself: the proxy passes its 400 and message on.
        "too many tokens (vLLM's 400)": ("/v1/chat/completions", chat("Hi", max_tokens=100_000), "max"),
    }
    with local_proxy(encoders=[fleet.encoder.url], pd=[fleet.pd.url], log_dir=tmp_path) as proxy:
        for name, (path, body, needle) in cases.items():
            reply = http(proxy.url + path, body)
            assert reply.status == 400, f"{name}: HTTP {reply.status} {reply.data[:500]!r}"
            message = str(reply.json().get("error", {}).get("message", ""))
            assert needle.lower() in message.lower(), f"{name}: {message!r}"
            assert reply.seconds < 10, f"{name} took {reply.seconds:.1f}s"
        # The PD is unharmed (a metadata-only reference would have killed its engine).
        assert http(fleet.pd.url + "/health").status == 200
        assert generate(proxy.url, good, False, "proxy after malformed")[1]


def test_media_the_encoder_cannot_load_get_a_4xx_and_the_pd_is_unharmed(fleet: Fleet, tmp_path: Path) -> None:
    """Bytes that are no image: the encoder's own 400, passed on. An http URL: this proxy, run by hand without a
    bundle, allows any host, but the encoder was rendered with no spec.media hosts, so vLLM's own allow-list
    refuses it (the rendered --allowed-media-domains at work, never a fetch). Each is one encoder request. A data
    URL that is not base64, an unsupported scheme and a file URL (no local files allowed) are refused by the proxy
    before any backend sees them. None reaches the PD, and the next normal request still equals the baseline."""
    refused = f"http://127.0.0.1:{free_port()}/cat.png"
    not_png = "data:image/png;base64," + base64.b64encode(b"these bytes are not an image" * 8).decode()
    # name: (url, status, a word of the message, encoder requests it costs)
    cases: dict[str, tuple[str, int, str, int]] = {
        "bytes that are no image": (not_png, 400, "image", 1),
        "an http URL no media host allows": (refused, 400, "allowed domains", 1),
        "a data URL that is not base64": ("data:image/png;base64,@@not-base64@@", 400, "not base64", 0),
        "an unsupported scheme": ("gopher://127.0.0.1/cat.png", 400, "scheme 'gopher'", 0),
        "a file URL": ("file:///nonexistent/cat.png", 400, "reads no local media files", 0),
    }
    good = chat([image_part(image_data_url(seed=5)), {"type": "text", "text": "What is this?"}])
    expected = baseline(fleet.baseline, good, "image (bad media reference)")
    with local_proxy(encoders=[fleet.encoder.url], pd=[fleet.pd.url], log_dir=tmp_path) as proxy:
        for name, (url, status, needle, encoder_requests) in cases.items():
            before = {role: metric(proxy, "epd_proxy_backend_requests_total", role=role) for role in ("encoder", "pd")}
            reply = http(proxy.url + "/v1/chat/completions", chat([image_part(url), {"type": "text", "text": "Hi"}]))
            TIMINGS.add(f"request proxy bad media: {name}", reply.seconds)
            assert reply.status == status, f"{name}: HTTP {reply.status} {reply.data[:500]!r}"
            message = str(reply.json()["error"]["message"])
            assert needle.lower() in message.lower(), f"{name}: {message!r}"
            assert "messages[0].content[0]" in message or encoder_requests, f"{name}: {message!r}"
            # Anything near a timeout is a hang (or a fetch the allow-list should have stopped).
            assert reply.seconds < 30, f"{name} took {reply.seconds:.1f}s"
            after = {role: metric(proxy, "epd_proxy_backend_requests_total", role=role) for role in ("encoder", "pd")}
            assert (after["encoder"] - before["encoder"], after["pd"] - before["pd"]) == (encoder_requests, 0), name
        assert metric(proxy, "epd_proxy_requests_total", status="400") == len(cases)
        assert http(fleet.encoder.url + "/health").status == 200
        assert http(fleet.pd.url + "/health").status == 200
        assert generate(proxy.url, good, False, "proxy image after bad media") == expected


def test_pd_frozen_then_killed_gives_a_clear_5xx_not_a_hang(spares: Spares, tmp_path: Path) -> None:
    """Last user of the dedicated PD: freezes it (SIGSTOP), wakes it, kills it mid-stream, then asks again."""
    fleet, pd = spares.fleet, spares.pd
    body = chat("Tell me a story.")
    expected = baseline(fleet.baseline, body, "text (PD down reference)")
    assert generate(pd.url, body, False, "doomed PD warm-up") == expected  # its first request is the slowest
    extra = ["--first-token-timeout", str(FIRST_TOKEN_TIMEOUT_S), "--probe-interval", str(PROBE_INTERVAL_S)]
    with local_proxy(encoders=[fleet.encoder.url], pd=[pd.url], extra_args=extra, log_dir=tmp_path) as proxy:
        assert generate(proxy.url, body, False, "proxy via doomed PD") == expected

        # Frozen (alive but silent): the first-token timeout answers 504, then the prober evicts it once its probes
        # went unanswered for the grace a busy engine gets: 503.
        os.killpg(pd.popen.pid, signal.SIGSTOP)
        try:
            hung = http(proxy.url + "/v1/chat/completions", body, timeout_s=60)
            assert hung.status == 504, hung.data[:500]
            assert FIRST_TOKEN_TIMEOUT_S - 0.5 <= hung.seconds < FIRST_TOKEN_TIMEOUT_S + 10
            assert "error" in hung.json() and hung.json()["error"]["message"]
            grace = DEFAULT_SLOW_PROBE_GRACE_S + 15
            wait_for(lambda: http(proxy.url + "/health").status == 503, grace, "eviction of the frozen PD")
            evicted = http(proxy.url + "/v1/chat/completions", body, timeout_s=60)
            assert evicted.status == 503 and evicted.seconds < 5, evicted
            assert "pd" in evicted.json()["error"]["message"]
        finally:
            os.killpg(pd.popen.pid, signal.SIGCONT)
        wait_for(lambda: http(proxy.url + "/health").status == 200, 30, "re-admission of the woken PD")
        assert generate(proxy.url, body, False, "proxy via woken PD") == expected

        # Killed mid-stream: the client gets an error event and [DONE], not a hang or a silent truncation.
        long = {**chat("Tell me a long story.", max_tokens=1500), "stream": True, "logprobs": False}
        streamed = stream_then(proxy, long, lambda: kill(pd))
        events, done = sse_events(streamed)
        assert done and events and "error" in events[-1], events[-2:]
        assert events[-1]["error"]["message"]

        # Dead: 5xx at once (connection refused, then evicted), streamed or not; /health says so too.
        for stream in (False, True):
            dead = http(proxy.url + "/v1/chat/completions", {**body, "stream": stream}, timeout_s=60)
            assert dead.status in (502, 503), dead
            assert dead.seconds < 10, dead
            assert dead.json()["error"]["message"]
        assert http(proxy.url + "/health").status == 503
        # The encoder path fails the same way (the encode stage runs, then the PD is missing).
        with_image = chat([image_part(image_data_url(seed=9)), {"type": "text", "text": "Hi"}])
        dead = http(proxy.url + "/v1/chat/completions", with_image, timeout_s=60)
        assert dead.status in (502, 503) and dead.seconds < 10, dead


def stream_then(proxy: LocalProxy, body: dict[str, Any], action: Callable[[], None]) -> bytes:
    """Open a streamed request, run `action` once the first bytes arrived, return everything the client got."""
    request = urllib.request.Request(
        proxy.url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200
        received: bytes = response.read1(65536)
        action()
        while chunk := response.read1(65536):
            received += chunk
    TIMINGS.add("request proxy stream killed mid-way", time.monotonic() - started)
    return received


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
