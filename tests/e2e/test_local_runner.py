"""The local runner end to end: examples/local-e-pd.yaml rendered by the operator on a loopback site and run
through epd-launch (one encoder, one PD sharing a folder, the proxy) answers through its proxy exactly as the
single-instance baseline does, token for token."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from epd_operator.local import processes, profile, sample
from tests.e2e.conftest import (
    REPO,
    TIMINGS,
    Launcher,
    VllmInstance,
    greedy_chat,
    image_data_url,
    progress,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

EXAMPLE = REPO / "examples" / "local-e-pd.yaml"
MAX_TOKENS = 12


def chat(content: str | list[dict[str, Any]]) -> dict[str, Any]:
    return greedy_chat(content, MAX_TOKENS)


def tokens(answer: dict[str, Any]) -> tuple[str, list[str]]:
    choice = answer["choices"][0]
    logprobs = (choice.get("logprobs") or {}).get("content") or []
    return str(choice["message"]["content"]), [entry["token"] for entry in logprobs]


def test_the_local_example_answers_through_its_proxy_as_the_baseline_does(
    request: pytest.FixtureRequest,
    launcher: Launcher,
    baseline_started: VllmInstance,
    tiny_model: Path,
    tmp_path: Path,
) -> None:
    """The session's baseline starts together with the local deployment when this module runs alone."""
    say = progress(request.config)
    plan = processes.plan_on_free_ports(EXAMPLE, tmp_path, tiny_model, profile.CPU)
    assert [i.role.value for i in plan.instances] == ["encoder", "pd", "proxy"]
    started = time.monotonic()
    with processes.deployment(plan, tmp_path, launcher.python, say=lambda line: say(f"local: {line}")) as local:
        TIMINGS.add("local runner: start E + PD + proxy", time.monotonic() - started)
        launcher.wait_healthy([baseline_started])
        baseline = baseline_started
        bodies = {
            "image": chat(
                [{"type": "image_url", "image_url": {"url": image_data_url(seed=3)}}, {"type": "text", "text": "What?"}]
            ),
            "text": chat("Hello, who are you?"),
        }
        for label, body in bodies.items():
            expected = tokens(baseline.post("/v1/chat/completions", body))
            begun = time.monotonic()
            got = tokens(sample.ask(plan.endpoint, body))
            TIMINGS.add(f"local runner: request {label}", time.monotonic() - begun)
            assert len(expected[1]) == MAX_TOKENS
            assert got == expected, f"{label}: the local deployment answered {got}, the baseline {expected}"
        assert list((tmp_path / "shared" / "ec").rglob("*")), "the encoder wrote no embeddings to the shared folder"
        assert not local.failed()
    assert not local.running
