"""examples/local-e-pd.yaml on real pods: the operator (in the cluster) created an encoder, a combined PD and the
proxy; each is a container of the built images started by epd-launch from its mounted bundle, and Ready only once
its readiness probe passes. Through `kubectl port-forward svc/local-e-pd-proxy` the answers equal the session's
single-instance baseline token for token (one image, two images, the same image twice, text only, an image sent
again; streamed and not, one streamed through the official `openai` client); every image went through the
encoder and the shared folder (ECExampleConnector on a hostPath)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import openai
import pytest
from openai.types.chat import ChatCompletionChunk

from epd_connectors.config.roles import Role
from epd_connectors.vllm_plugins import cpu_amx_tiles
from epd_testenv import realnode
from tests.e2e.conftest import REPO, SERVED_MODEL, TIMINGS, VllmInstance
from tests.e2e.pods.conftest import Applied, RealCluster, RealEPD, applied, ready
from tests.e2e.pods.kube import condition
from tests.e2e.test_local_e_p_d import CASES, MAX_TOKENS, ask, chat, image, text, tokens, total
from tests.unit.packaging.image_list import cpu_tags, tags

pytestmark = [pytest.mark.e2e, pytest.mark.pods, pytest.mark.timeout(1800)]

EXAMPLE = REPO / "examples" / "local-e-pd.yaml"
ROLES = {Role.ENCODER: cpu_tags()["vllm"], Role.PD: cpu_tags()["vllm"], Role.PROXY: tags()["proxy"]}
"""The example's roles and the image each runs."""


@pytest.fixture(scope="module")
def epd(
    request: pytest.FixtureRequest,
    real_cluster: RealCluster,
    e_p_d_applied: Applied,
    tiny_model: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RealEPD]:
    """The E+PD, applied just after the E+P+D of test_e_p_d.py (e_p_d_applied), so all their pods load at once."""
    workdir = tmp_path_factory.mktemp("e-pd")
    with applied(real_cluster, EXAMPLE, tiny_model, workdir, label="E+PD") as it, ready(request, it) as epd:
        yield epd


def timestamp(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_every_role_is_a_ready_container_started_by_epd_launch_from_its_bundle(epd: RealEPD) -> None:
    pods = {pod["metadata"]["labels"]["app.kubernetes.io/component"]: pod for pod in epd.pods()}
    assert set(pods) == {role.value for role in ROLES}, sorted(pods)
    ready_at = []
    for role, image_tag in ROLES.items():
        pod = pods[role.value]
        assert pod["spec"]["nodeName"] == realnode.NODE_NAME
        (status,) = pod["status"]["containerStatuses"]
        assert status["ready"] and status["started"] and status["restartCount"] == 0, status
        assert status["image"].endswith(image_tag), status
        (container,) = pod["spec"]["containers"]
        assert container["readinessProbe"], f"{role.value} has no readiness probe"
        ready = condition(pod, "Ready")
        assert ready is not None and ready["status"] == "True"
        ready_at.append(timestamp(ready["lastTransitionTime"]))
        log = epd.log(role)
        assert f"epd-launch[{role.value}]: exec" in log, log[-2000:]
    assert cpu_amx_tiles.isa_choices(epd.log(Role.PD)), "the PD logged no attention ISA"
    epd_ready = condition(epd.get(), "Ready")
    assert epd_ready is not None
    assert timestamp(epd_ready["lastTransitionTime"]) >= max(ready_at), "Ready before every pod's probe passed"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_proxy_answers_as_the_baseline(
    epd: RealEPD, baseline: VllmInstance, real_cluster: RealCluster, case: str, stream: bool
) -> None:
    proxy_before, encoder_before = epd.metrics(Role.PROXY), epd.metrics(Role.ENCODER)
    images = 0
    for content in CASES[case]:
        expected = tokens(baseline.post("/v1/chat/completions", chat(content)))
        begun = time.monotonic()
        got = ask(epd.endpoint, chat(content, stream=stream))
        TIMINGS.add(f"E+PD on real pods: {case}, {'streamed' if stream else 'whole'}", time.monotonic() - begun)
        assert got == expected, f"{case}: the real pods answered {got}, the baseline {expected}"
        images += sum(1 for part in content if isinstance(part, dict) and part["type"] == "image_url")
    rewritten = "epd_proxy_media_items_total"
    proxy = epd.metrics(Role.PROXY)
    assert total(proxy, rewritten, result="rewritten") - total(proxy_before, rewritten, result="rewritten") == images
    served = "vllm:request_success_total"
    assert total(epd.metrics(Role.ENCODER), served) - total(encoder_before, served) >= (1 if images else 0)


def test_the_embeddings_went_through_the_shared_folder(epd: RealEPD) -> None:
    """ECExampleConnector: the encoder wrote each image's embedding under the hostPath, the PD read it there."""
    shared = Path(epd.get()["spec"]["sharedStorage"]["hostPath"]["path"])
    ask(epd.endpoint, chat([image(21), text("And this one?")]))
    written = [p for p in (shared / "ec").rglob("*") if p.is_file()]
    assert written, f"nothing under {shared / 'ec'}"


def test_the_official_openai_client_streams_the_baselines_answer(epd: RealEPD, baseline: VllmInstance) -> None:
    content: list[dict[str, Any]] = [image(22), text("What is in this image?")]
    expected = tokens(baseline.post("/v1/chat/completions", chat(content)))
    client = openai.OpenAI(base_url=f"{epd.endpoint}/v1", api_key="unused", max_retries=0, timeout=120)
    created = client.chat.completions.create(
        model=SERVED_MODEL,
        messages=[{"role": "user", "content": content}],  # type: ignore[list-item,misc]
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        logprobs=True,
        seed=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    stream = cast("openai.Stream[ChatCompletionChunk]", created)  # stream=True: the chunks' overload
    answer, toks = "", []
    for event in stream:
        for choice in event.choices:
            answer += choice.delta.content or ""
            toks += [entry.token for entry in (choice.logprobs.content or [])] if choice.logprobs else []
    assert (answer, toks) == expected


def test_kubectl_describe_shows_the_operators_events(epd: RealEPD, real_cluster: RealCluster) -> None:
    described = real_cluster.kubectl.run("describe", "epd", "-n", epd.namespace, epd.name)
    assert "Events:" in described and "<none>" not in described.split("Events:", 1)[1][:200], described[-1500:]
