"""E + P + D for real through the local runner: examples/local-e-p-d.yaml (a Mooncake master and store client, an
encoder pushing embeddings to the prefill over ECMooncakeConnector/TCP, a prefill handing KV to a decode with
MooncakeConnector P2P plus MooncakeStoreConnector, the proxy) as local processes, and the checks every E+P+D
tier shares (the cases, `serve_case`, the decode's counters, the store's keys).

The cases themselves (one image, two images, the same image twice, text only, an image again; streamed and not,
each equal to the baseline token for token with no prompt token computed by the decode) run where the operator
deploys this example, on real pods (tests/e2e/pods/test_e_p_d.py), and through the store alone in
test_local_e_p_d_store.py. This module's deployment proves what only local processes show:
- store: a fresh prompt's blocks land under the deployment's KV cache prefix (`/get_all_keys` on the master's
  metrics port), written by the prefill's MooncakeStoreConnector, from an image the encoder served;
- the CPU workarounds: besides ec_idle_load, mooncake_cpu_device (MooncakeConnector's worker asks torch for the
  accelerator's device index and dies at start without a GPU: shown with it switched off) and
  multi_connector_metrics (vLLM 0.32.0's MultiConnector metrics assert that MooncakeConnector has Prometheus
  metrics, and the prefill answers 500 from its first transfer) say what they did in the processes that need them;
- the Mooncake master dies and is started again the way a cluster does it: the same argv, bundle and ports
  (`LocalDeployment.restart`, what the master's Deployment does with its pod), nothing else touched, and the
  deployment recovers by itself. What the clients see (this CPU build, vLLM 0.32.0, Mooncake 0.3.13, TCP): the
  store client's open RPC fails at once ("RPC call failed"), its pings fail and it reconnects once the master is
  back, mounting its segment again; MooncakeStoreConnector in the prefill and the decode raises nothing to anyone
  (each lookup waits out Mooncake's -900, the prefill's asynchronous batch_put fails with -900); requests during
  the outage are served correctly, KV still moving prefill -> decode over P2P, only slower; after the restart
  the prefill writes new blocks to the store again, under the deployment's KV prefix. The restarted master holds
  none of the old keys (no HA, no snapshot restore; the client's remount hands it segments, never objects), but
  its pool need not be empty once the capacity is back: the prefill's store jobs run one at a time on one thread
  (KVCacheStoreSendingThread), each waiting out -900 twice (batch_is_exist, then batch_put), so a job queued
  during the outage (the earlier image asked again, a proxy canary) may put its blocks on the restarted master
  after the remount. So the test asserts that the keys of an image asked only before the outage are gone, and
  come back when that image is asked again. The module's last test.

Instances: the session's baseline and this module's deployment (3 vLLM, master, store client, proxy), stopped
when the module ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from epd_connectors import store_probe
from epd_connectors.config.kv_transfer import MooncakeStoreConnectorConfig, connectors_of
from epd_connectors.config.roles import Role
from epd_connectors.vllm_plugins import cpu_amx_tiles, mooncake_cpu_device
from epd_local import processes, profile
from epd_local.plan import Instance, LocalPlan
from epd_local.processes import LocalDeployment
from epd_operator.derive.site import LOOPBACK
from tests.e2e.conftest import REPO, TIMINGS, VllmInstance, greedy_chat, image_data_url, local_example
from tests.e2e.cpu import has_amx_tiles

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

EXAMPLE = REPO / "examples" / "local-e-p-d.yaml"
MAX_TOKENS = 12
SETTLE_S = 10.0
"""How long a counter or a store key may lag behind the answer (vLLM records stats after it answers; the prefill
writes the store asynchronously)."""


def chat(content: str | list[dict[str, Any]], *, stream: bool = False) -> dict[str, Any]:
    return greedy_chat(content, MAX_TOKENS, stream=stream)


def image(seed: int) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": image_data_url(seed=seed)}}


def text(words: str) -> dict[str, Any]:
    return {"type": "text", "text": words}


Tokens = tuple[str, list[str]]


def tokens(answer: dict[str, Any]) -> Tokens:
    choice = answer["choices"][0]
    logprobs = (choice.get("logprobs") or {}).get("content") or []
    return str(choice["message"]["content"]), [entry["token"] for entry in logprobs]


def stream_tokens(events: list[dict[str, Any]]) -> Tokens:
    """The text and tokens of a chat completion's server-sent events, as the whole answer would give them."""
    content, toks = "", []
    for event in events:
        for choice in event.get("choices", []):
            content += (choice.get("delta") or {}).get("content") or ""
            toks += [entry["token"] for entry in ((choice.get("logprobs") or {}).get("content") or [])]
    return content, toks


REQUEST_TIMEOUT_S = 120.0
"""How long a test's request waits for the proxy's answer unless the test says otherwise."""


def post(url: str, body: dict[str, Any], timeout_s: float = REQUEST_TIMEOUT_S) -> bytes:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            data: bytes = response.read()
            return data
    except urllib.error.HTTPError as error:  # the proxy's body names the stage and the instance: keep it in sight
        payload = error.read()
        reason = f"{error.reason}: {payload[:500]!r}"
        raise urllib.error.HTTPError(error.url, error.code, reason, error.headers, io.BytesIO(payload)) from None


def ask(endpoint: str, body: dict[str, Any], timeout_s: float = REQUEST_TIMEOUT_S) -> Tokens:
    """Through the proxy, streamed or not, as (text, tokens)."""
    data = post(f"{endpoint}/v1/chat/completions", body, timeout_s)
    if not body.get("stream"):
        return tokens(json.loads(data))
    events = []
    for line in data.decode().splitlines():
        payload = line.removeprefix("data: ").strip()
        if line.startswith("data: ") and payload != "[DONE]":
            events.append(json.loads(payload))
    assert data.decode().rstrip().endswith("data: [DONE]"), f"the stream did not end with [DONE]: {data[-200:]!r}"
    return stream_tokens(events)


def get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def samples(text_: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a Prometheus text page, keyed by (name, labels)."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text_):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = float(sample.value)
    return out


def total(page: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in page.items() if n == name and want <= ls)


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Served(Protocol):
    """A running E+P+D deployment as the checks below read it: as local processes (LocalEPD) or as real pods
    (tests/e2e/pods)."""

    @property
    def endpoint(self) -> str:
        """The proxy's base URL."""
        ...

    @property
    def kv_prefix(self) -> str: ...

    def metrics(self, role: Role) -> Samples: ...

    def store_keys(self) -> set[str]: ...


@dataclass
class LocalEPD:
    """The running example and what its tests read."""

    plan: LocalPlan
    local: LocalDeployment

    @property
    def endpoint(self) -> str:
        return self.plan.endpoint

    def instance(self, role: Role) -> Instance:
        return next(i for i in self.plan.instances if i.role is role)

    def vllm_url(self, role: Role) -> str:
        bundle = self.instance(role).bundle
        assert bundle.vllm is not None
        return f"http://{LOOPBACK}:{bundle.vllm.port}"

    def metrics(self, role: Role) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        if role is Role.PROXY:
            bundle = self.instance(role).bundle
            assert bundle.proxy is not None
            return samples(get_text(f"http://{LOOPBACK}:{bundle.proxy.port}/metrics"))
        return samples(get_text(f"{self.vllm_url(role)}/metrics"))

    @property
    def master_http(self) -> str:
        master = self.instance(Role.MASTER).bundle.master
        assert master is not None
        return f"http://{LOOPBACK}:{master.metrics_port}"

    def store_keys(self) -> set[str]:
        """Every key the master holds (its /get_all_keys: one key per line)."""
        return {line.strip() for line in get_text(f"{self.master_http}/get_all_keys").splitlines() if line.strip()}

    @property
    def kv_prefix(self) -> str:
        kv = self.instance(Role.PREFILL).bundle.kv_transfer
        assert kv is not None
        store = [c for c in connectors_of(kv) if isinstance(c, MooncakeStoreConnectorConfig)]
        assert store, "the example's prefill has no MooncakeStoreConnector"
        return store[0].kv_connector_extra_config.cache_prefix

    def log(self, role: Role) -> str:
        return self.local.get(self.instance(role).name).log.read_text(errors="replace")


@dataclass(frozen=True)
class DecodeCounts:
    """The decode's prompt-token counters: where each prompt token's KV came from."""

    requests: float
    prompt: float
    computed: float
    transferred: float
    cached_locally: float
    from_p2p: float

    @staticmethod
    def read(epd: Served) -> DecodeCounts:
        page = epd.metrics(Role.DECODE)
        source = "vllm:prompt_tokens_by_source_total"
        return DecodeCounts(
            requests=total(page, "vllm:request_success_total"),
            prompt=total(page, "vllm:prompt_tokens_total"),
            computed=total(page, source, source="local_compute"),
            transferred=total(page, source, source="external_kv_transfer"),
            cached_locally=total(page, source, source="local_cache_hit"),
            from_p2p=total(page, "vllm:prompt_tokens_cached_by_source_total", source="p2p"),
        )

    def minus(self, before: DecodeCounts) -> DecodeCounts:
        return DecodeCounts(*(getattr(self, f.name) - getattr(before, f.name) for f in dataclasses.fields(self)))


def decode_counts_after(epd: Served, before: DecodeCounts, requests: int) -> DecodeCounts:
    """The decode's counters once it has recorded `requests` more finished requests (they lag the answer)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        delta = DecodeCounts.read(epd).minus(before)
        if delta.requests >= requests or time.monotonic() > deadline:
            return delta
        time.sleep(0.2)


def assert_the_decode_computed_no_prompt_token(delta: DecodeCounts, label: str) -> None:
    assert delta.prompt > 0, f"{label}: the decode recorded no prompt tokens: {delta}"
    assert delta.computed == 0, f"{label}: the decode computed {delta.computed} prompt tokens itself: {delta}"
    assert delta.transferred > 0, f"{label}: no prompt token reached the decode by KV transfer: {delta}"
    assert delta.transferred + delta.cached_locally == delta.prompt, f"{label}: {delta}"
    assert delta.from_p2p == delta.transferred, f"{label}: the transfer did not come from the P2P peer: {delta}"


def example_variant(workdir: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of the example with `edit` applied to its parsed YAML (a variant of the same deployment)."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    edit(doc)
    path = workdir / "manifest.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


@contextlib.contextmanager
def running_example(
    request: pytest.FixtureRequest,
    python: Path,
    model: Path,
    workdir: Path,
    label: str,
    *,
    manifest: Path = EXAMPLE,
) -> Iterator[LocalEPD]:
    """The example (or a variant) started by the local runner (CPU profile, free loopback ports), stopped after;
    the tail of every log is printed when a test failed."""
    plan = processes.plan_on_free_ports(manifest, workdir, model, profile.CPU)
    roles = [i.role.value for i in plan.instances]
    assert roles == ["master", "store-client", "encoder", "prefill", "decode", "proxy"], roles
    started = time.monotonic()
    with local_example(request, plan, workdir, python, label) as local:
        TIMINGS.add(f"{label}: start E+P+D, store, proxy", time.monotonic() - started)
        warm_up(plan.endpoint, label)
        yield LocalEPD(plan, local)
    assert not local.running


WARM_UP_PROMPT = "Warm up the transfer engines, please."


def warm_up(endpoint: str, label: str) -> None:
    """One text request through the proxy before the tests measure anything.

    The very first P2P KV transfer of a fresh deployment failed once in about 17 starts here ("pulling kv_caches
    failed: Mooncake transfer engine returned -1"; cause not found, not seen again in later runs). The operator
    renders kv_load_failure_policy "recompute", so such a request is still answered correctly (the decode
    recomputes the blocks), but the counters the tests read would then show local computation. This request
    takes that first transfer; every request the tests send after it must move KV as asserted.
    """
    begun = time.monotonic()
    answer = ask(endpoint, chat(WARM_UP_PROMPT))
    TIMINGS.add(f"{label}: warm-up request", time.monotonic() - begun)
    assert len(answer[1]) == MAX_TOKENS, f"{label}: the warm-up request answered {answer}"


@pytest.fixture(scope="module")
def epd(
    request: pytest.FixtureRequest, e2e_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalEPD]:
    with running_example(request, e2e_python, tiny_model, tmp_path_factory.mktemp("e-p-d"), "E+P+D") as it:
        yield it


CASES: dict[str, list[list[dict[str, Any]] | str]] = {
    "one image": [[image(3), text("What is in this image?")]],
    "two images": [[image(4), image(5), text("Compare the two pictures.")]],
    "same image twice": [[image(6), image(6), text("Are these the same?")]],
    "text only": ["Hello, who are you?"],
    "image again": [[image(7), text("What?")], [image(7), text("Describe it once more, please.")]],
}
"""Each case's requests, sent in order (the last case sends an image a second time, with another question)."""


MEASURE_ATTEMPTS = 3
"""Tries at a case whose decode counters must be its own: the proxy's canaries (one per transfer path every
spec.proxy.transferCheck.intervalSeconds) reach the decode too, and one may land in the window."""


def serve_case(epd: Served, baseline: VllmInstance, case: str, stream: bool, label: str) -> DecodeCounts:
    """Send a case's requests through the proxy: each answer equals the baseline's, and every image went to the
    encoder and on as a reference. Returns what the decode's counters moved by, measured again when a request
    that is not the case's (a canary) finished at the decode meanwhile."""
    sent = len(CASES[case])
    for _ in range(MEASURE_ATTEMPTS):
        before = DecodeCounts.read(epd)
        _send_case(epd, baseline, case, stream, label)
        delta = decode_counts_after(epd, before, sent)
        time.sleep(0.5)  # a canary under way when the case's last request finished shows by now
        if DecodeCounts.read(epd).minus(before).requests == sent:
            return delta
    raise AssertionError(f"{case}: other requests reached the decode in each of {MEASURE_ATTEMPTS} tries: {delta}")


def _send_case(epd: Served, baseline: VllmInstance, case: str, stream: bool, label: str) -> None:
    proxy_before = epd.metrics(Role.PROXY)
    images = 0
    for content in CASES[case]:
        expected = tokens(baseline.post("/v1/chat/completions", chat(content)))
        assert len(expected[1]) == MAX_TOKENS
        begun = time.monotonic()
        got = ask(epd.endpoint, chat(content, stream=stream))
        TIMINGS.add(f"{label} request: {case}, {'streamed' if stream else 'whole'}", time.monotonic() - begun)
        assert got == expected, f"{case}: the {label} deployment answered {got}, the baseline {expected}"
        images += sum(1 for part in content if isinstance(part, dict) and part["type"] == "image_url")
    proxy = epd.metrics(Role.PROXY)
    rewritten = total(proxy, "epd_proxy_media_items_total", result="rewritten")
    kept = total(proxy, "epd_proxy_media_items_total", result="kept")
    assert rewritten - total(proxy_before, "epd_proxy_media_items_total", result="rewritten") == images
    assert kept == total(proxy_before, "epd_proxy_media_items_total", result="kept")


def new_store_keys(epd: Served, before: set[str]) -> set[str]:
    """The keys the store gained since `before` (the prefill writes asynchronously: waits up to SETTLE_S for
    the first), after checking that every key it holds is under the deployment's KV prefix."""
    deadline = time.monotonic() + SETTLE_S
    while not (new := epd.store_keys() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert new, f"nothing was written to the store (keys before: {sorted(before)})"
    time.sleep(0.5)  # the rest of this prompt's blocks
    keys = epd.store_keys()
    assert all(epd.kv_prefix in key for key in keys), f"keys outside the prefix {epd.kv_prefix}: {sorted(keys)}"
    return keys - before


LONG_QUESTION = "Tell me everything you can see in this picture, in as much detail as you can manage. " * 2
"""Long enough for several full 32-token blocks."""


def test_without_the_cpu_device_plugin_a_mooncake_connector_prefill_dies_at_start(
    e2e_python: Path, tiny_model: Path, tmp_path: Path
) -> None:
    """The defect mooncake_cpu_device works around, shown on the same prefill with the plugin switched off in its
    env (EPD_MOONCAKE_CPU_DEVICE=0): MooncakeConnector's worker asks torch for the accelerator's device index
    and the engine core dies at start. vLLM's API server may live on (its engine core can hang on the way out):
    the runner stops the role as soon as the core's death is logged. Only the store and that prefill run; the
    module's deployment is not up yet (this test comes first)."""

    def plugin_off(doc: dict[str, Any]) -> None:
        doc["spec"]["prefill"]["env"] = {mooncake_cpu_device.TOGGLE_ENV: "0"}

    plan = processes.plan_on_free_ports(example_variant(tmp_path, plugin_off), tmp_path, tiny_model, profile.CPU)
    only = {"master", "store-client", "prefill"}
    with (
        pytest.raises(
            processes.StartError, match=r"prefill \(prefill\) failed before it was ready: .*EngineCore failed to start"
        ),
        processes.deployment(plan, tmp_path, e2e_python, say=lambda line: None, only=only, deadline_s=600),
    ):
        pass
    log = (tmp_path / f"{plan.deployment}-prefill" / "log.txt").read_text(errors="replace")
    assert f"not applied: disabled by {mooncake_cpu_device.TOGGLE_ENV}=0" in log
    assert "torch.accelerator.current_device_index()" in log and "Found no NVIDIA driver" in log


def test_a_fresh_prompt_lands_in_the_store_under_the_deployments_prefix(epd: LocalEPD) -> None:
    """The prefill's MooncakeStoreConnector writes every full block of a new prompt to the store (asynchronously,
    after it answers); the master lists them, every key under the deployment's derived KV prefix."""
    keys_before = epd.store_keys()
    encoder_before = total(epd.metrics(Role.ENCODER), "vllm:request_success_total")
    ask(epd.plan.endpoint, chat([image(11), text(LONG_QUESTION)]))
    assert len(new_store_keys(epd, keys_before)) >= 2, "a prompt of several full blocks stored fewer than two"
    # At least: a transfer canary of the proxy (one a minute per path) may reach the encoder meanwhile.
    assert total(epd.metrics(Role.ENCODER), "vllm:request_success_total") - encoder_before >= 1


def test_the_cpu_workarounds_were_applied_where_they_are_needed(epd: LocalEPD) -> None:
    """The plugins say what they did, in the processes that needed them (and nowhere else it matters). The
    attention ISA is this CPU's: "amx" (with AMX tile permission granted) where torch reports AMX tiles."""
    prefill, decode = epd.log(Role.PREFILL), epd.log(Role.DECODE)
    want_isa = "amx" if has_amx_tiles() else "vec"
    for log in (prefill, decode):
        assert "epd mooncake_cpu_device: vLLM 0.32.0 on the CPU platform" in log
        assert "epd multi_connector_metrics: vLLM 0.32.0" in log
        assert {choice.split()[0] for choice in cpu_amx_tiles.isa_choices(log)} == {want_isa}, log[-3000:]
        if want_isa == "amx":
            assert re.search(r"AMX tile permission for pid \d+ granted \(", log), log[-3000:]
    assert "epd ec_idle_load: vLLM" in prefill
    assert "Traceback" not in prefill + decode, "a vLLM role logged a traceback"


RECOVER_S = 60.0
"""How long the store client may take to mount its segment on the restarted master (measured: about 1 s)."""
PUT_FAILED = "batch_put failed"
"""The prefill worker's warning when MooncakeStoreConnector could not store a request's blocks."""
MASTER_UNREACHABLE = "-900"


def fresh_prompt_lands_in_the_store(epd: LocalEPD, baseline: VllmInstance, seed: int, label: str) -> set[str]:
    """A new image and question through the proxy: equal to the baseline, no prompt token computed on the decode,
    and new keys under the KV prefix in the store (returned)."""
    keys_before = epd.store_keys()
    assert_served_like_the_baseline(epd, baseline, seed, label)
    return new_store_keys(epd, keys_before)


def assert_served_like_the_baseline(epd: LocalEPD, baseline: VllmInstance, seed: int, label: str) -> float:
    body = chat([image(seed), text(f"What do you see? ({label})")])
    expected = tokens(baseline.post("/v1/chat/completions", body))
    before = DecodeCounts.read(epd)
    begun = time.monotonic()
    got = ask(epd.plan.endpoint, body)
    took = time.monotonic() - begun
    TIMINGS.add(f"master restart: request {label}", took)
    assert got == expected, f"{label}: the deployment answered {got}, the baseline {expected}"
    assert_the_decode_computed_no_prompt_token(decode_counts_after(epd, before, 1), label)
    return took


def wait_for_any_key(epd: LocalEPD, wanted: set[str]) -> set[str]:
    """The keys of `wanted` the store lists, once it lists one (the prefill writes asynchronously)."""
    deadline = time.monotonic() + SETTLE_S
    while not (found := epd.store_keys() & wanted):
        assert time.monotonic() < deadline, f"none of {sorted(wanted)} was written to the store again"
        time.sleep(0.2)
    return found


def wait_for_log(epd: LocalEPD, role: Role, *needles: str) -> str:
    """The first line of the role's log holding every needle (the workers log asynchronously)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        for line in epd.log(role).splitlines():
            if all(needle in line for needle in needles):
                return line
        assert time.monotonic() < deadline, f"{role.value} never logged a line with {needles}"
        time.sleep(0.5)


def test_the_deployment_serves_through_a_master_restart_and_uses_the_store_again(
    epd: LocalEPD, baseline: VllmInstance
) -> None:
    master = epd.instance(Role.MASTER)
    client = epd.instance(Role.STORE_CLIENT)
    assert master.bundle.master is not None and client.bundle.store_client is not None
    segment = client.bundle.store_client.global_segment_size
    others = {run.name: run.popen.pid for run in epd.local.running if run.name != master.name}

    stored = fresh_prompt_lands_in_the_store(epd, baseline, 40, "before the outage")
    # An image asked only before the outage: nothing puts its blocks again until it is asked after the restart.
    lost = fresh_prompt_lands_in_the_store(epd, baseline, 43, "before the outage, not asked during it")
    before_outage = epd.store_keys()
    assert stored <= before_outage and lost <= before_outage

    dead = epd.local.get(master.name)
    epd.local.kill(master.name)
    assert not dead.alive()
    assert_served_like_the_baseline(epd, baseline, 41, "while the master is down")
    assert "RPC call failed" in epd.log(Role.STORE_CLIENT), "the store client did not notice the master was gone"
    wait_for_log(epd, Role.PREFILL, PUT_FAILED, MASTER_UNREACHABLE)
    assert_served_like_the_baseline(epd, baseline, 40, "an earlier image, while the master is down")

    began = time.monotonic()
    restarted = epd.local.restart(master.name)
    assert restarted.alive() and restarted.popen.pid != dead.popen.pid, "the master was not started anew"
    metrics = master.bundle.master.metrics_url(LOOPBACK)
    assert store_probe.wait_for_capacity(metrics, at_least=segment, timeout_s=RECOVER_S) == segment
    TIMINGS.add("master restart: restart until the pool is mounted again", time.monotonic() - began)
    # Every key of before the outage is lost; only the image asked again during it (its store job may still be
    # waiting out -900 when the master is back) can have been put again since.
    survived = epd.store_keys() & (before_outage - stored)
    assert not survived, f"keys survived the master restart (it keeps none without HA): {sorted(survived)}"

    fresh_prompt_lands_in_the_store(epd, baseline, 42, "after the restart")
    assert_served_like_the_baseline(epd, baseline, 43, "an earlier image, after the restart")
    wait_for_any_key(epd, lost)  # the restart lost its blocks; the prefill stores them again
    assert {run.name: run.popen.pid for run in epd.local.running if run.name != master.name} == others
    assert not epd.local.failed(), "a role died during the outage"
