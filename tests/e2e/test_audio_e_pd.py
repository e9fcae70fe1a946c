"""Audio inputs, disaggregated, on real vLLM (the CPU build): examples/local-e-pd-audio.yaml run by the local runner
with the tiny Qwen2-Audio (its encoder runs the audio tower, its PD takes each clip's embedding through the shared
folder, its own proxy from the rendered bundle in front), against a single vLLM instance of the same model.

Every answer equals the baseline's token for token (greedy), streamed and not; each clip went the transfer way
(the proxy rewrote it to a metadata-only audio_embeds reference, the encoder reported its placeholder count, the
EC folder holds its entry under the proxy's uuid); the proxy's canary proved the encoder-to-PD path with an audio
clip. A request mixing an image and a clip cannot be served by this model (Qwen2-Audio takes no images): the
proxy answers vLLM's own refusal, as the single instance does. Clips are 16 kHz mono WAVs made here.
"""

from __future__ import annotations

import base64
import io
import math
import struct
import time
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from epd_connectors.proxy.media import content_uuid
from epd_local import processes, profile
from tests.e2e.conftest import (
    TIMINGS,
    Launcher,
    VllmInstance,
    greedy_chat,
    image_data_url,
    local_example,
    tiny_server,
    vllm_bundle,
)
from tests.e2e.ec_example.test_proxy_flow import Counts, Output, generate, http
from tests.tiny_model import AUDIO_SCRIPT
from tests.tiny_model import build as tiny_model_build

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "local-e-pd-audio.yaml"
SERVED = "tiny-qwen2-audio"
MAX_TOKENS = 12
RATE = 16000
"""The tiny model's feature extractor's rate: vLLM resamples nothing (its resampler needs torchaudio)."""


@dataclass(frozen=True)
class AudioStack:
    baseline: VllmInstance
    """One vLLM instance of the audio model, no connector: the reference answers."""
    url: str
    """The example's own proxy."""
    ec_folder: Path


@pytest.fixture(scope="module")
def audio_model(e2e_python: Path) -> Path:
    started = time.monotonic()
    model = tiny_model_build(e2e_python, "run `make setup-e2e`", script=AUDIO_SCRIPT)
    TIMINGS.add("tiny audio model (build or cache hit)", time.monotonic() - started)
    return model


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, launcher: Launcher, audio_model: Path) -> Iterator[AudioStack]:
    """The example's encoder, PD and proxy (the local runner) and the baseline, started together."""
    workdir = launcher.workdir / "local-e-pd-audio"
    workdir.mkdir(parents=True, exist_ok=True)
    baseline = launcher.start(
        "baseline-audio", vllm_bundle("baseline-audio", tiny_server(audio_model, "pd", served_model_name=SERVED))
    )
    plan = processes.plan_on_free_ports(EXAMPLE, workdir, audio_model, profile.CPU)
    assert [i.role.value for i in plan.instances] == ["encoder", "pd", "proxy"]
    started = time.monotonic()
    try:
        with local_example(request, plan, workdir, launcher.python, "audio") as local:
            launcher.wait_healthy([baseline])
            TIMINGS.add(
                "audio: the local runner's E+PD, its proxy and a baseline ready (wall)", time.monotonic() - started
            )
            yield AudioStack(baseline, plan.endpoint, workdir / "shared" / "ec")
            assert not local.failed(), f"a role of the example died: {local.failed()}"
    finally:
        launcher.stop_each([baseline])


def wav_clip(frequency: float, seconds: float = 1.0) -> bytes:
    """A mono 16-bit WAV at RATE: a tone with a second, fainter one, so two frequencies make two clips."""
    samples = (
        int(
            9000 * math.sin(2 * math.pi * frequency * i / RATE)
            + 3000 * math.sin(2 * math.pi * 3.1 * frequency * i / RATE)
        )
        for i in range(int(RATE * seconds))
    )
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as clip:
        clip.setnchannels(1)
        clip.setsampwidth(2)
        clip.setframerate(RATE)
        clip.writeframes(b"".join(struct.pack("<h", sample) for sample in samples))
    return buffer.getvalue()


def clip_part(frequency: float) -> dict[str, Any]:
    data = base64.b64encode(wav_clip(frequency)).decode()
    return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}


def chat(content: list[dict[str, Any]]) -> dict[str, Any]:
    return {**greedy_chat(content, MAX_TOKENS), "model": SERVED}


def text(words: str) -> dict[str, Any]:
    return {"type": "text", "text": words}


def reference(stack: AudioStack, body: dict[str, Any], label: str) -> Output:
    expected = generate(stack.baseline.url, body, False, f"baseline audio {label}")
    assert len(expected[1]) == MAX_TOKENS
    return expected


def assert_proxy_answers(stack: AudioStack, body: dict[str, Any], expected: Output, label: str) -> None:
    """Not streamed and streamed, the example's proxy answers as the baseline, token for token."""
    assert generate(stack.url, body, False, f"audio proxy {label}") == expected
    assert generate(stack.url, body, True, f"audio proxy {label}, streamed") == expected


def test_one_clip_through_the_proxy_equals_the_baseline_via_an_audio_embeds_reference(stack: AudioStack) -> None:
    part = clip_part(440.0)
    body = chat([part, text("What is that sound?")])
    expected = reference(stack, body, "one clip")
    before = Counts.read(stack)
    assert_proxy_answers(stack, body, expected, "one clip")
    # Both requests had their clip rewritten to a reference (the PD got the placeholder count, no samples).
    assert Counts.read(stack).since(before) == Counts(rewritten=2, kept=0, encoder_requests=2, pd_requests=2)
    uuid = content_uuid("input_audio", part)
    assert list(stack.ec_folder.glob(f"{uuid}*/*")), f"no EC entry under the proxy's uuid {uuid}"
    # The answer really depends on the clip.
    other = chat([clip_part(880.0), text("What is that sound?")])
    assert generate(stack.url, other, False, "audio proxy another clip") != expected


def test_several_clips_with_a_repeat_equal_the_baseline(stack: AudioStack) -> None:
    first, second = clip_part(300.0), clip_part(1200.0)
    body = chat([first, text("Compare"), second, text("with"), first])
    expected = reference(stack, body, "three clips")
    before = Counts.read(stack)
    assert_proxy_answers(stack, body, expected, "three clips")
    # Three references per request; the two distinct clips went to the one encoder as one batch.
    assert Counts.read(stack).since(before) == Counts(rewritten=6, kept=0, encoder_requests=2, pd_requests=2)


def test_text_only_skips_the_encoder(stack: AudioStack) -> None:
    body = chat([text("Hello, who are you?")])
    expected = reference(stack, body, "text")
    before = Counts.read(stack)
    assert_proxy_answers(stack, body, expected, "text")
    assert Counts.read(stack).since(before) == Counts(0, 0, 0, 2)


def test_the_proxy_proved_the_encoder_to_pd_path_with_an_audio_canary(stack: AudioStack) -> None:
    """spec.model.modalities [audio]: the canary sends a clip; this model refuses an image, so an image canary
    would never pass (and the path would count as failing)."""
    deadline = time.monotonic() + 90
    transfers: list[dict[str, Any]] = []
    while time.monotonic() < deadline:  # a canary that timed out on a busy machine is retried within seconds
        transfers = http(stack.url + "/health").json()["transfers"]
        if transfers and all(t["state"] == "ok" and t["failures"] == 0 for t in transfers):
            break
        time.sleep(1)
    assert [(t["path"], t["from_role"], t["to_role"], t["state"], t["failures"]) for t in transfers] == [
        ("ec", "encoder", "pd", "ok", 0)
    ], transfers


def test_an_image_with_a_clip_is_refused_as_the_single_instance_refuses_it(stack: AudioStack) -> None:
    """Qwen2-Audio takes no images, so no request can mix the two on this model: the proxy answers vLLM's own 400
    (its encoder refuses the image), the same message the single instance gives."""
    body = chat([{"type": "image_url", "image_url": {"url": image_data_url(seed=5)}}, clip_part(440.0), text("What?")])
    alone = http(stack.baseline.url + "/v1/chat/completions", body)
    through = http(stack.url + "/v1/chat/completions", body)
    assert alone.status == through.status == 400, (alone, through)
    assert through.json()["error"]["message"] == alone.json()["error"]["message"]
    assert "image" in alone.json()["error"]["message"]
