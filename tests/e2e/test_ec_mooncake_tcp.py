"""E+PD with ECMooncakeConnector over TCP on the CPU build: the encoder pushes each embedding to the PD's EC control
address, and the PD answers exactly as the single-instance baseline does, through the real proxy.

An idle consumer needs epd_connectors' vLLM plugin (ec_idle_load): the V1 model runner never runs the EC
connector's load on a step that schedules no tokens, so without the plugin the one-time load instruction is lost
and the request fails with HTTP 500 after push_wait_timeout_s. A second PD, started with the plugin turned off
(EPD_EC_IDLE_LOAD=0), shows that failure; the PD with the plugin (the default) serves the same flow.

Instances: the session's baseline, and an encoder and two PDs of this module, started at once and stopped when the
module ends (the unpatched PD as soon as its test is done); a short push_wait_timeout_s keeps the failing case to
seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from epd_connectors.config.bundle import RoleBundle
from epd_connectors.config.ec_transfer import ECMooncakeConsumer, ECMooncakeProducer
from epd_connectors.config.roles import Role
from epd_connectors.proxy.local import LocalProxy, local_proxy
from epd_connectors.vllm_plugins.ec_idle_load import TOGGLE_ENV
from tests.e2e.conftest import (
    LOOPBACK,
    TIMINGS,
    Launcher,
    VllmInstance,
    free_port,
    greedy_chat,
    image_data_url,
    tiny_server,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

MAX_TOKENS = 12
PUSH_WAIT_S = 6.0
"""The consumers' push_wait_timeout_s: how long an unserved load waits before the request fails (vLLM: 60)."""
MOONCAKE_EXTRA = {"mooncake_protocol": "tcp", "push_wait_timeout_s": PUSH_WAIT_S}
EC_BUFFER = "64 MiB"
"""Each instance's registered transfer pool (vLLM's default is 1e9 bytes; the tiny model's embeddings are KiB)."""
HOST_ENV = {"VLLM_HOST_IP": LOOPBACK}
"""What the transfer engine advertises to its peers; loopback here (a pod's IP in a cluster)."""
PLUGIN_APPLIED = "epd ec_idle_load: vLLM"
PLUGIN_RAN = "epd ec_idle_load: ran the EC connector's load section"
PLUGIN_DISABLED = f"epd ec_idle_load: not applied: disabled by {TOGGLE_ENV}=0"


@dataclass
class MooncakeFleet:
    baseline: VllmInstance
    encoder: VllmInstance
    pd: VllmInstance
    """The PD with the plugin (the default)."""
    pd_unpatched: VllmInstance
    """The PD started with the plugin turned off."""

    @staticmethod
    def zmq(pd: VllmInstance) -> str:
        ec = pd.bundle.ec_transfer
        assert isinstance(ec, ECMooncakeConsumer)
        return f"tcp://{ec.ec_ip}:{ec.ec_port}"


def _consumer(launcher: Launcher, model: Path, name: str, env: dict[str, str]) -> VllmInstance:
    ec = ECMooncakeConsumer(
        ec_buffer_device="cpu",
        ec_buffer_size=EC_BUFFER,
        ec_ip=LOOPBACK,
        ec_port=free_port(),
        ec_connector_extra_config=MOONCAKE_EXTRA,
    )
    bundle = RoleBundle(deployment=f"e2e-{name}", role=Role.PD, vllm=tiny_server(model, "pd"), ec_transfer=ec, env=env)
    return launcher.start(name, bundle)


@pytest.fixture(scope="module")
def mooncake(launcher: Launcher, baseline_started: VllmInstance, tiny_model: Path) -> Iterator[MooncakeFleet]:
    """The session's baseline; the encoder and both PDs, started at once and stopped when the module ends (so the
    next module's instances never overlap them in memory)."""
    started = time.monotonic()
    producer = ECMooncakeProducer(
        ec_buffer_device="cpu", ec_buffer_size=EC_BUFFER, ec_connector_extra_config=MOONCAKE_EXTRA
    )
    encoder = launcher.start(
        "mc-encoder",
        RoleBundle(
            deployment="e2e-mc-encoder",
            role=Role.ENCODER,
            vllm=tiny_server(tiny_model, "encoder"),
            ec_transfer=producer,
            env=HOST_ENV,
        ),
    )
    pd = _consumer(launcher, tiny_model, "mc-pd", HOST_ENV)
    pd_unpatched = _consumer(launcher, tiny_model, "mc-pd-unpatched", {**HOST_ENV, TOGGLE_ENV: "0"})
    instances = [encoder, pd, pd_unpatched]
    try:
        launcher.wait_healthy([baseline_started, *instances])
        TIMINGS.add("mooncake: encoder, two PDs healthy (wall)", time.monotonic() - started)
        yield MooncakeFleet(baseline=baseline_started, encoder=encoder, pd=pd, pd_unpatched=pd_unpatched)
    finally:
        launcher.stop_each(instances)


@pytest.fixture(scope="module")
def proxy(mooncake: MooncakeFleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalProxy]:
    """The real epd-proxy in front of the encoder and the patched PD, pushing to the PD's EC address."""
    with local_proxy(
        encoders=[mooncake.encoder.url],
        pd=[mooncake.pd.url],
        ec_consumers=[MooncakeFleet.zmq(mooncake.pd)],
        log_dir=tmp_path_factory.mktemp("proxy"),
    ) as running:
        yield running


def chat(content: list[dict[str, Any]]) -> dict[str, Any]:
    """A greedy chat request that always produces MAX_TOKENS tokens."""
    return greedy_chat(content, MAX_TOKENS)


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def text(words: str) -> dict[str, Any]:
    return {"type": "text", "text": words}


def post(url: str, body: dict[str, Any], timeout_s: float = 120.0) -> tuple[int, bytes]:
    """POST JSON; the status and the raw body (an HTTP error is an answer here, not an exception)."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())


def generated(status: int, data: bytes, where: str) -> tuple[str, list[str]]:
    """The text and tokens of a complete chat answer."""
    assert status == 200, f"{where}: HTTP {status}: {data[:2000]!r}"
    choice = json.loads(data)["choices"][0]
    tokens = [entry["token"] for entry in (choice.get("logprobs") or {}).get("content") or []]
    return str(choice["message"]["content"]), tokens


def generated_stream(status: int, data: bytes, where: str) -> tuple[str, list[str]]:
    """The text and tokens of a streamed chat answer, joined from its server-sent events up to [DONE]."""
    assert status == 200, f"{where}: HTTP {status}: {data[:2000]!r}"
    text_out, tokens = "", []
    lines = [line.removeprefix("data: ").strip() for line in data.decode().splitlines() if line.startswith("data: ")]
    assert lines and lines[-1] == "[DONE]", f"{where}: the stream did not end with [DONE]: {lines[-3:]}"
    for payload in lines[:-1]:
        for choice in json.loads(payload).get("choices", []):
            text_out += (choice.get("delta") or {}).get("content") or ""
            tokens += [entry["token"] for entry in (choice.get("logprobs") or {}).get("content") or []]
    return text_out, tokens


def ask(base_url: str, body: dict[str, Any], label: str, *, stream: bool = False) -> tuple[str, list[str]]:
    started = time.monotonic()
    status, data = post(f"{base_url}/v1/chat/completions", {**body, "stream": stream})
    TIMINGS.add(f"request {label}", time.monotonic() - started)
    return (generated_stream if stream else generated)(status, data, label)


def test_plugin_patches_only_the_v1_runner_and_nothing_under_the_v2_runner(e2e_python: Path) -> None:
    """In the e2e venv's real vLLM: with VLLM_USE_V2_MODEL_RUNNER=1 the plugin patches nothing and leaves no
    import hook; otherwise it wraps the V1 runner's execute_model (inherited by the CPU runner) once, when the
    runner module is imported, and never the V2 runner's."""
    script = textwrap.dedent(
        """
        import os, sys
        from epd_connectors.vllm_plugins import _patching, ec_idle_load as plugin
        marker = plugin.PATCHED_ATTRIBUTE
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
        plugin.register()
        hooked = any(isinstance(f, _patching.PatchOnImport) for f in sys.meta_path)
        from vllm.v1.worker import gpu_model_runner as v1
        from vllm.v1.worker.gpu import model_runner as v2
        v1_original = v1.GPUModelRunner.execute_model
        v2_original = v2.GPUModelRunner.execute_model
        under_v2 = {"hooked": hooked, "v1": hasattr(v1_original, marker), "v2": hasattr(v2_original, marker)}
        del os.environ["VLLM_USE_V2_MODEL_RUNNER"]
        plugin.register()
        plugin.register()
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
        wrapped = v1.GPUModelRunner.execute_model
        under_v1 = {
            "v1": hasattr(wrapped, marker),
            "cpu": CPUModelRunner.execute_model is wrapped,
            "once": wrapped.__wrapped__ is v1_original,
            "v2": hasattr(v2.GPUModelRunner.execute_model, marker),
        }
        import json, vllm
        print(json.dumps({"version": vllm.__version__, "under_v2": under_v2, "under_v1": under_v1}))
        """
    )
    started = time.monotonic()
    env = {key: value for key, value in os.environ.items() if key not in (TOGGLE_ENV, "VLLM_USE_V2_MODEL_RUNNER")}
    result = subprocess.run(
        [str(e2e_python), "-c", script], capture_output=True, text=True, env=env, check=False, timeout=300
    )
    TIMINGS.add("plugin V1/V2 check (import vLLM)", time.monotonic() - started)
    assert result.returncode == 0, result.stderr[-4000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["under_v2"] == {"hooked": False, "v1": False, "v2": False}, seen
    assert seen["under_v1"] == {"v1": True, "cpu": True, "once": True, "v2": False}, seen


def test_without_the_plugin_an_idle_consumer_fails_after_push_wait_and_with_it_succeeds(
    mooncake: MooncakeFleet,
) -> None:
    """The request contract by hand: the encoder gets consumer_zmq and the transfer id, the PD the transfer id.
    The unpatched PD loses the load instruction (it is idle: the step schedules no tokens) and answers 500 after
    push_wait_timeout_s; the patched PD answers the baseline's tokens."""
    body = chat([image(image_data_url(seed=11)), text("Describe the image.")])
    expected = ask(mooncake.baseline.url, body, "mooncake: baseline (contract reference)")

    def through(pd: VllmInstance, label: str) -> tuple[int, bytes, float]:
        transfer_id = uuid.uuid4().hex
        encode_body = {
            **body,
            "max_tokens": 1,
            "ec_transfer_params": {"consumer_zmq": MooncakeFleet.zmq(pd), "ec_items": [{"transfer_id": transfer_id}]},
        }
        status, data = post(f"{mooncake.encoder.url}/v1/chat/completions", encode_body)
        assert status == 200, f"encoder: HTTP {status}: {data[:2000]!r}"
        started = time.monotonic()
        pd_body = {**body, "ec_transfer_params": {"ec_items": [{"transfer_id": transfer_id}]}}
        status, data = post(f"{pd.url}/v1/chat/completions", pd_body, timeout_s=PUSH_WAIT_S + 120)
        elapsed = time.monotonic() - started
        TIMINGS.add(f"request {label}", elapsed)
        return status, data, elapsed

    status, data, elapsed = through(mooncake.pd_unpatched, "mooncake: unpatched PD (expected 500)")
    assert status == 500, f"the unpatched PD should fail, got HTTP {status}: {data[:500]!r}"
    assert PUSH_WAIT_S * 0.8 <= elapsed <= PUSH_WAIT_S + 120, f"failed after {elapsed:.1f}s, not after push_wait"
    assert mooncake.pd_unpatched.healthy(), "the unpatched PD's engine should survive the failed request"
    assert PLUGIN_DISABLED in mooncake.pd_unpatched.log.read_text(errors="replace")
    assert PLUGIN_APPLIED not in mooncake.pd_unpatched.log.read_text(errors="replace")
    mooncake.pd_unpatched.stop()  # its part is done; free its memory for the rest of the module

    status, data, elapsed = through(mooncake.pd, "mooncake: patched PD")
    assert generated(status, data, "patched PD") == expected  # a lost load would have failed after push_wait
    log = mooncake.pd.log.read_text(errors="replace")
    assert PLUGIN_APPLIED in log and PLUGIN_RAN in log, "the PD's log should say the plugin wrapped and ran"


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "streamed"])
def test_through_the_proxy_one_image_and_a_repeated_image_equal_the_baseline(
    mooncake: MooncakeFleet, proxy: LocalProxy, stream: bool
) -> None:
    """One image; the same image twice in a request; and the first request again (an image the encoder and
    the PD have seen): each through the proxy (encoder pushes to the PD over TCP) equals the baseline."""
    kind = "streamed" if stream else "complete"
    first = image_data_url(seed=21 if stream else 31)
    one = chat([image(first), text("Describe the image.")])
    twice = chat([image(first), text("and again"), image(first)])
    for label, body in (("one image", one), ("a repeated image", twice), ("one image again", one)):
        expected = ask(mooncake.baseline.url, body, f"mooncake: baseline {label}")
        got = ask(proxy.url, body, f"mooncake: proxy {label} ({kind})", stream=stream)
        assert got == expected, f"{label} ({kind}): the E+PD answer differs from the baseline\n{proxy.log()[-3000:]}"
