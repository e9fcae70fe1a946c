"""The local runner end to end: examples/local-e-pd.yaml rendered by the operator on a loopback site and run
through epd-launch (one encoder, one PD sharing a folder, the proxy: this folder's fleet) answers through its own
proxy exactly as the single-instance baseline does, token for token, and the embeddings went through the folder."""

from __future__ import annotations

import time
from typing import Any

import pytest

from epd_local import sample
from tests.e2e.conftest import TIMINGS, greedy_chat, image_data_url
from tests.e2e.ec_example.conftest import Fleet

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

MAX_TOKENS = 12


def chat(content: str | list[dict[str, Any]]) -> dict[str, Any]:
    return greedy_chat(content, MAX_TOKENS)


def tokens(answer: dict[str, Any]) -> tuple[str, list[str]]:
    choice = answer["choices"][0]
    logprobs = (choice.get("logprobs") or {}).get("content") or []
    return str(choice["message"]["content"]), [entry["token"] for entry in logprobs]


def test_the_local_example_answers_through_its_proxy_as_the_baseline_does(fleet: Fleet) -> None:
    bodies = {
        "image": chat(
            [{"type": "image_url", "image_url": {"url": image_data_url(seed=3)}}, {"type": "text", "text": "What?"}]
        ),
        "text": chat("Hello, who are you?"),
    }
    for label, body in bodies.items():
        expected = tokens(fleet.baseline.post("/v1/chat/completions", body))
        begun = time.monotonic()
        got = tokens(sample.ask(fleet.endpoint, body))
        TIMINGS.add(f"local runner: request {label}", time.monotonic() - begun)
        assert len(expected[1]) == MAX_TOKENS
        assert got == expected, f"{label}: the local deployment answered {got}, the baseline {expected}"
    assert list(fleet.ec_folder.rglob("*")), "the encoder wrote no embeddings to the shared folder"
