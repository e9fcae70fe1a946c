"""examples/local-e-pd.yaml on real pods: the operator (in the cluster) created an encoder, a combined PD and the
proxy; each is a container of the built images started by epd-launch from its mounted bundle, and Ready only once
its readiness probe passes. Through `kubectl port-forward svc/local-e-pd-proxy` the answers equal the session's
single-instance baseline token for token (one image, two images, the same image twice, text only, an image sent
again; streamed and not, one streamed through the official `openai` client); every image went through the
encoder and the shared folder (ECExampleConnector on a hostPath).

Last, its encoders scale themselves: KEDA (built from its Go module, beside the cluster) and the cluster's HPA
controller, on the proxy's own gauges in the tier's Prometheus. Under load they grow 1 -> 2 and go back to 1 when
it stops; under text-only traffic they go to 0, and an image request waits for one and is answered. Every answer
is the baseline's, and the figures feed bench/autoscale."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import openai
import pytest
from openai.types.chat import ChatCompletionChunk

from epd_connectors.config.roles import Role
from epd_connectors.vllm_plugins import cpu_amx_tiles
from epd_operator.api import constants as c
from epd_operator.render.autoscaling import prometheus_label
from epd_testenv import realnode
from tests.e2e.conftest import REPO, SERVED_MODEL, TIMINGS, VllmInstance
from tests.e2e.pods.conftest import Applied, RealCluster, RealEPD, applied, ready, workload
from tests.e2e.pods.kube import condition, eventually
from tests.e2e.pods.traffic import LOAD, loads, patch, pod_ready, roster
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


# -- the encoders scale themselves (KEDA and the cluster's HPA controller, on the proxy's own gauges)

HOLD_S = 300
"""How long the proxy holds an image request while an encoder starts from zero (the tiny model loads in about a
minute here)."""
MAX_ENCODERS = 2
TARGET = 0.05
"""In flight per encoder. The tiny model encodes an image in a small part of a request's time, so four clients keep
only a fraction of a request at the encoders on average: at 0.2 the HPA once scaled the new encoder away under
load while it was starting. Far below what the load keeps there, only the load's end brings the 30 s average
under it."""
AUTOSCALING = {
    "minReplicas": 1,
    "maxReplicas": MAX_ENCODERS,
    "signals": [{"signal": "inFlight", "target": TARGET}],
    "pollingSeconds": 2,
    "scaleDown": {"stabilizationSeconds": 30, "periodSeconds": 15},
    "holdSeconds": HOLD_S,
}
"""Encoders on their default signal (the proxy's requests outstanding at them, averaged over 30 s) with a target
the tiny model's fast encoder stays above under the load below; quick steps down, so the test waits less (a
deployment keeps the defaults: 300 s)."""
CONCURRENT_LOADS = 4
"""Clients sending one after another each: enough that the encoder always has work outstanding."""
SCALE_S = 600.0
"""Until a scaling step shows: a new encoder loads the model in about a minute here, more while others start."""
TEXT_ONLY: list[list[dict[str, Any]] | str] = ["Say something.", "Count to three."]


@dataclass
class Figures:
    """What bench/autoscale prints: kept in the JSON file EPD_AUTOSCALE_FIGURES names, when it names one."""

    path: Path | None

    def record(self, **figures: float) -> None:
        if self.path is None:
            return
        known = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.path.write_text(json.dumps({**known, **figures}, indent=2))


@pytest.fixture(scope="module")
def figures() -> Figures:
    named = os.environ.get("EPD_AUTOSCALE_FIGURES")
    return Figures(Path(named) if named else None)


def encoder_deployment(epd: RealEPD) -> dict[str, Any]:
    found: dict[str, Any] = epd.kubectl.json("get", "deployment", "-n", epd.namespace, workload(epd.name, Role.ENCODER))
    return found


def role_pods(epd: RealEPD, role: Role) -> list[dict[str, Any]]:
    return [p for p in epd.pods() if p["metadata"]["labels"][c.LABEL_COMPONENT] == role.value]


def encoder_pods(epd: RealEPD) -> list[dict[str, Any]]:
    return role_pods(epd, Role.ENCODER)


@dataclass
class Replicas:
    """The encoder Deployment's replicas read every second from a thread: each change and when it came; and the
    signal KEDA reads, every other second, so a step nobody expected says what the HPA saw."""

    epd: RealEPD
    signal: Callable[[], float | None]
    changes: list[tuple[float, int]] = field(default_factory=list)
    signals: list[tuple[float, float | None]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        tick = 0
        while not self._stop.wait(1.0):
            tick += 1
            with contextlib.suppress(AssertionError, KeyError):  # a read that failed: the next one counts
                count = int(encoder_deployment(self.epd)["spec"].get("replicas", 1))
                if not self.changes or self.changes[-1][1] != count:
                    self.changes.append((time.monotonic(), count))
            if tick % 2 == 0:
                with contextlib.suppress(AssertionError, OSError, ValueError, KeyError, IndexError):
                    self.signals.append((time.monotonic(), self.signal()))

    def timeline(self, since: float) -> str:
        """The replicas and the signal, in seconds from `since`."""
        steps = ", ".join(f"{at - since:.0f} s: {n}" for at, n in self.changes)
        readings = ", ".join(f"{at - since:.0f}: {'-' if v is None else f'{v:.3f}'}" for at, v in self.signals)
        return f"replicas {steps}; signal (target {TARGET} per encoder) {readings}"

    def stop(self) -> None:
        self._stop.set()

    @property
    def counts(self) -> list[int]:
        return [count for _, count in self.changes]

    def at(self, count: int, after: float) -> float | None:
        """When the replicas became `count`, after `after` (time.monotonic)."""
        return next((t for t, n in self.changes if n == count and t >= after), None)


@contextlib.contextmanager
def watching(epd: RealEPD, real_cluster: RealCluster) -> Iterator[Replicas]:
    query = encoder_query(epd)
    replicas = Replicas(epd, lambda: signal(real_cluster, query))
    thread = threading.Thread(target=replicas.run, name="replicas", daemon=True)
    thread.start()
    try:
        yield replicas
    finally:
        replicas.stop()
        thread.join(timeout=30)


def scrape_the_proxy(epd: RealEPD, real_cluster: RealCluster) -> None:
    """Prometheus scrapes the proxy through the tests' port-forward, labelled as the chart's PodMonitor labels
    the proxy's series, so the ScaledObject's query (rendered for a real cluster) selects them."""
    labels = {
        "namespace": epd.namespace,
        prometheus_label(c.LABEL_DEPLOYMENT): epd.name,
        prometheus_label(c.LABEL_ROLE): Role.PROXY.value,
    }
    real_cluster.prometheus.scrape({epd.endpoint.removeprefix("http://"): labels})


def encoder_query(epd: RealEPD) -> str:
    """The query of the encoder ScaledObject's trigger: what KEDA asks Prometheus."""
    scaled = epd.kubectl.json("get", "scaledobject", "-n", epd.namespace, workload(epd.name, Role.ENCODER))
    [trigger] = scaled["spec"]["triggers"]
    return str(trigger["metadata"]["query"])


def signal(real_cluster: RealCluster, query: str) -> float | None:
    """The value KEDA reads now, through the same Prometheus."""
    result = real_cluster.prometheus.query(query)
    return float(result[0]["value"][1]) if result else None


def operator_owns_replicas(epd: RealEPD) -> bool:
    fields = encoder_deployment(epd)["metadata"].get("managedFields", [])
    return any(f["manager"] == c.FIELD_MANAGER and "f:replicas" in f["fieldsV1"].get("f:spec", {}) for f in fields)


def autoscaling_condition(epd: RealEPD) -> dict[str, Any]:
    found = condition(epd.get(), c.COND_AUTOSCALING)
    assert found is not None, epd.get()["status"].get("conditions")
    return found


def start_seconds(pod: dict[str, Any]) -> float:
    """From the pod's creation to its Ready condition (the API's timestamps, whole seconds)."""
    ready = condition(pod, "Ready")
    assert ready is not None and ready["status"] == "True", pod["status"]
    return (timestamp(ready["lastTransitionTime"]) - timestamp(pod["metadata"]["creationTimestamp"])).total_seconds()


def replica_seconds(changes: list[tuple[float, int]], start: float, end: float) -> float:
    """The replicas' integral over [start, end], from the changes seen (each holds until the next)."""
    total_s, count, since = 0.0, changes[0][1] if changes else 0, start
    for at, new in changes:
        if at > since:
            total_s += count * (min(at, end) - since)
            since = min(at, end)
        count = new
    return total_s + count * max(end - since, 0.0)


def test_the_encoders_grow_to_two_under_load_and_back_to_one_when_it_stops(
    epd: RealEPD, baseline: VllmInstance, real_cluster: RealCluster, figures: Figures
) -> None:
    scrape_the_proxy(epd, real_cluster)
    first_encoder = {p["metadata"]["name"] for p in encoder_pods(epd)}
    patch(epd, {"encoder": {"autoscaling": AUTOSCALING}})
    eventually(lambda: autoscaling_condition(epd)["status"] == "True", "KEDA's HPA reporting (Autoscaling True)", 120)
    assert {p["metadata"]["name"] for p in encoder_pods(epd)} == first_encoder, "turning autoscaling on rolled"
    # Prometheus reads its targets file at once and scrapes every second: the signal's series comes within seconds.
    query = encoder_query(epd)
    eventually(lambda: signal(real_cluster, query) is not None, "the encoder's signal in Prometheus", 60)
    with watching(epd, real_cluster) as replicas:
        began = time.monotonic()
        with loads(epd, baseline, LOAD, CONCURRENT_LOADS) as running:
            eventually(lambda: roster(epd, "encoder") == 2, "the proxy routing to 2 encoders", SCALE_S)
            routed = time.monotonic()
            [new_encoder] = [p for p in encoder_pods(epd) if p["metadata"]["name"] not in first_encoder]
            served = sum(len(load.answers) for load in running)
            eventually(lambda: sum(len(load.answers) for load in running) >= served + len(LOAD), "answers with 2", 120)
            assert not operator_owns_replicas(epd), "the operator applies the replicas the HPA moves"
        stopped = time.monotonic()
        eventually(lambda: len(encoder_pods(epd)) == 1, "back to 1 encoder after the load", SCALE_S)
        back = time.monotonic()
    scaled = replicas.at(2, began)
    assert scaled is not None, replicas.changes
    TIMINGS.add("real pods, autoscaled: load on, until the HPA asks for 2 encoders", scaled - began)
    TIMINGS.add("real pods, autoscaled: load on, until the proxy routes to 2 encoders", routed - began)
    TIMINGS.add("real pods, autoscaled: load off, until 1 encoder is left", back - stopped)
    own_start = start_seconds(new_encoder)
    TIMINGS.add("real pods, autoscaled: the new encoder's own start (pod created to Ready)", own_start)
    used = replica_seconds(replicas.changes, began, back)
    figures.record(
        routed_s=routed - began,
        own_start_s=own_start,
        requests=sum(load.sent for load in running),
        failed=sum(len(load.failed) for load in running),
        replica_seconds=used,
        fixed_fleet_replica_seconds=MAX_ENCODERS * (back - began),
        scale_down_s=back - stopped,
    )
    for i, load in enumerate(running):
        load.report(f"autoscaled 1 -> 2 -> 1, client {i}")
    failed = [f for load in running for f in load.failed]
    wrong = [w for load in running for w in load.wrong]
    assert not failed and not wrong, (failed, wrong)
    assert replicas.counts == [1, 2, 1], f"flapping: {replicas.timeline(began)}"


def test_text_only_traffic_lets_the_encoders_go_to_zero_and_one_image_wakes_one(
    epd: RealEPD, baseline: VllmInstance, real_cluster: RealCluster, figures: Figures
) -> None:
    proxy_before = {p["metadata"]["name"] for p in role_pods(epd, Role.PROXY)}
    patch(epd, {"encoder": {"autoscaling": {"minReplicas": 0}}})

    def proxy_replaced() -> bool:  # the proxy's bundle now says how long to hold a media request: it rolled
        pods = role_pods(epd, Role.PROXY)
        return len(pods) == 1 and pods[0]["metadata"]["name"] not in proxy_before and pod_ready(pods[0])

    eventually(proxy_replaced, "the proxy rolled with encoders that may go to 0", SCALE_S, poll_s=2)
    epd.forget(Role.PROXY)  # the forward followed the old pod
    epd.endpoint = epd.url(Role.PROXY)
    scrape_the_proxy(epd, real_cluster)
    with watching(epd, real_cluster) as replicas, loads(epd, baseline, TEXT_ONLY, 1) as [text_load]:
        began = time.monotonic()
        eventually(lambda: not encoder_pods(epd), "no encoder left under text-only traffic", SCALE_S)
        gone = time.monotonic()
        answered = len(text_load.answers)
        eventually(lambda: len(text_load.answers) > answered, "a text answer with no encoder", 120)
    assert not text_load.failed and not text_load.wrong, (text_load.failed, text_load.wrong)
    TIMINGS.add("real pods, autoscaled: text only, until no encoder is left", gone - began)
    assert replicas.counts[-1] == 0, replicas.changes

    content: list[dict[str, Any]] = [image(41), text("What is in this image?")]
    expected = tokens(baseline.post("/v1/chat/completions", chat(content)))
    asked = time.monotonic()
    got = ask(epd.endpoint, chat(content), timeout_s=HOLD_S + 60)
    woken = time.monotonic() - asked
    TIMINGS.add("real pods, autoscaled: an image at 0 encoders, until answered", woken)
    figures.record(to_zero_s=gone - began, woken_s=woken)
    assert got == expected
    # KEDA wakes one; the HPA then reads the held request against this test's low target (1 / TARGET per encoder)
    # and may ask for the most. With the default target (4) one request keeps one encoder.
    assert 1 <= len(encoder_pods(epd)) <= MAX_ENCODERS
    assert not operator_owns_replicas(epd)
