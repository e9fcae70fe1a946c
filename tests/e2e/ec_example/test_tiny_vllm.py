"""Real vLLM (CPU build) serving the tiny Qwen2-VL: a single instance is deterministic, and an encoder with a PD
consumer (ECExampleConnector over a shared folder) answers exactly as the single instance does."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.e2e.conftest import TIMINGS, VllmInstance, greedy_chat, image_data_url
from tests.e2e.ec_example.conftest import Fleet

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

MAX_TOKENS = 12


def chat(content: str | list[dict[str, Any]], max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """A greedy chat request that always produces max_tokens tokens (random weights rarely stop by themselves)."""
    return greedy_chat(content, max_tokens)


def with_image(url: str, text: str = "Describe the image.") -> list[dict[str, Any]]:
    return [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]


def answer(instance: VllmInstance, body: dict[str, Any], label: str) -> tuple[str, list[str]]:
    """The generated text and its tokens (as the server names them), timing the request."""
    started = time.monotonic()
    response = instance.post("/v1/chat/completions", body)
    TIMINGS.add(f"request {label}", time.monotonic() - started)
    choice = response["choices"][0]
    tokens = [entry["token"] for entry in (choice.get("logprobs") or {}).get("content") or []]
    return str(choice["message"]["content"]), tokens


def test_baseline_text_only_is_deterministic(fleet: Fleet) -> None:
    first = answer(fleet.baseline, chat("Hello, who are you?"), "baseline text")
    second = answer(fleet.baseline, chat("Hello, who are you?"), "baseline text again")
    assert len(first[1]) == MAX_TOKENS
    assert first == second


def test_baseline_image_is_deterministic_and_depends_on_the_image(fleet: Fleet) -> None:
    first = answer(fleet.baseline, chat(with_image(image_data_url(seed=1))), "baseline image")
    second = answer(fleet.baseline, chat(with_image(image_data_url(seed=1))), "baseline image again")
    other = answer(fleet.baseline, chat(with_image(image_data_url(seed=2))), "baseline other image")
    assert len(first[1]) == MAX_TOKENS
    assert first == second
    assert other != first, "the output should depend on the image (weights are random with std 0.2)"


def encode(fleet: Fleet, body: dict[str, Any], label: str) -> dict[str, Any]:
    """Send the request to the encoder (one token, as a proxy does); its ec_transfer_params, by mm hash."""
    started = time.monotonic()
    encoded = fleet.encoder.post("/v1/chat/completions", {**body, "max_tokens": 1})
    TIMINGS.add(f"request {label}", time.monotonic() - started)
    params = encoded.get("ec_transfer_params")
    assert isinstance(params, dict) and params, f"the encoder reported no items: {encoded}"
    for mm_hash in params:
        assert list(fleet.ec_folder.rglob(f"*{mm_hash}*")), f"the encoder wrote nothing for {mm_hash}"
    return params


def as_image_embeds(body: dict[str, Any], items: dict[str, Any]) -> dict[str, Any]:
    """The request with its i-th image replaced by the encoder's item i: image_embeds carrying only the grid
    metadata, and uuid = the encoder's mm hash, so the PD neither loads nor hashes the image."""
    by_index = {index: (mm_hash, item) for mm_hash, item in items.items() for index in item["item_indices"]}
    images = 0
    content: list[dict[str, Any]] = []
    for part in body["messages"][0]["content"]:
        if part["type"] == "image_url":
            mm_hash, item = by_index[images]
            content.append({"type": "image_embeds", "image_embeds": item["metadata"], "uuid": mm_hash})
            images += 1
        else:
            content.append(part)
    assert images == len(by_index)
    return {**body, "messages": [{"role": "user", "content": content}]}


def test_encoder_then_pd_equals_baseline(fleet: Fleet) -> None:
    body = chat(with_image(image_data_url(seed=3)))
    expected = answer(fleet.baseline, body, "baseline (E+PD reference)")
    encode(fleet, body, "encoder")
    assert answer(fleet.pd, body, "E+PD original request") == expected


def test_encoder_then_pd_with_image_embeds_and_uuid_equals_baseline(fleet: Fleet) -> None:
    body = chat(with_image(image_data_url(seed=4)))
    expected = answer(fleet.baseline, body, "baseline (E+PD rewritten reference)")
    items = encode(fleet, body, "encoder (rewritten)")
    (item,) = items.values()
    assert item["metadata"].get("image_grid_thw") == [1, 4, 4], item  # a 64x64 image: 4 image tokens
    assert answer(fleet.pd, as_image_embeds(body, items), "E+PD image_embeds + uuid") == expected


def streamed(instance: VllmInstance, body: dict[str, Any], label: str) -> tuple[str, list[str]]:
    """The text and tokens of a streamed answer, joined from its chunks."""
    started = time.monotonic()
    events = instance.post_stream("/v1/chat/completions", body)
    TIMINGS.add(f"request {label}", time.monotonic() - started)
    text, tokens = "", []
    for event in events:
        for choice in event.get("choices", []):
            text += (choice.get("delta") or {}).get("content") or ""
            tokens += [entry["token"] for entry in (choice.get("logprobs") or {}).get("content") or []]
    return text, tokens


def test_encoder_then_pd_two_images_and_a_repeated_one_streamed_or_not_equal_baseline(fleet: Fleet) -> None:
    first, second = image_data_url(seed=5), image_data_url(seed=6)
    content: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": first}},
        {"type": "text", "text": "Compare"},
        {"type": "image_url", "image_url": {"url": second}},
        {"type": "text", "text": "with"},
        {"type": "image_url", "image_url": {"url": first}},
    ]
    body = chat(content)
    expected = answer(fleet.baseline, body, "baseline (three images)")
    assert streamed(fleet.baseline, body, "baseline (three images, streamed)") == expected

    items = encode(fleet, body, "encoder (three images)")
    assert sorted(index for item in items.values() for index in item["item_indices"]) == [0, 1, 2]
    assert len(items) == 2, "the repeated image is one item with two indices"
    rewritten = as_image_embeds(body, items)
    assert answer(fleet.pd, rewritten, "E+PD three images") == expected
    assert streamed(fleet.pd, rewritten, "E+PD three images, streamed") == expected
