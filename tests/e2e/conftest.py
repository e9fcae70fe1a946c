"""Real vLLM (the CPU build, from .venv-e2e) serving the project's tiny Qwen2-VL, started through `epd-launch`.

Each instance is a `RoleBundle` built from epd_connectors' models, exactly what the operator renders, run as
`epd-launch <role> --bundle FILE` with the e2e venv's Python (so `epd-launch` execs that venv's vLLM server). It
listens on a free loopback port, logs to a file that is printed when it dies or does not become healthy in time,
and is stopped (its whole process group: the API server and its engine core) at teardown.

The tier is opt-in: its tests are deselected unless the run selects `e2e` (`pytest -m e2e`, `make test-e2e`,
`make test`) or names a path under tests/e2e, so `pytest`, `pytest -m unit` and `make test-fast` never need the
e2e venv. A session of the tier prints its wall time and peak memory (its own and the machine's) under "e2e
timings".
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from epd_connectors.config.bundle import RoleBundle
from epd_connectors.config.ec_transfer import ECExampleConnectorConfig
from epd_connectors.config.roles import Role
from epd_connectors.config.vllm import VllmServerConfig
from epd_local import failures, processes, profile
from epd_local.failures import LogWatch
from epd_local.plan import LocalPlan
from epd_local.processes import LocalDeployment, attention_note
from epd_local.sample import png_bytes
from tests.e2e.cpu import cpu_summary
from tests.e2e.memory import MemorySampler
from tests.tiny_model import build as tiny_model_build

LOOPBACK = "127.0.0.1"
REPO = Path(__file__).resolve().parents[2]
E2E_VENV_ENV = "EPD_E2E_VENV"
E2E_VENV = Path(os.environ.get(E2E_VENV_ENV, REPO / ".venv-e2e"))
E2E_VENV = E2E_VENV if E2E_VENV.is_absolute() else REPO / E2E_VENV
SERVED_MODEL = "tiny-qwen2-vl"
START_DEADLINE_S = float(os.environ.get("EPD_E2E_START_DEADLINE_S", "900"))
"""An instance answers /health after about a minute on 2 idle cores; several starting at once on a busy box
take longer."""
SETUP_HINT = "run `make setup-e2e` (installs the CPU build of vLLM into .venv-e2e and builds the tiny model)"

KV_CACHE_BYTES = 64 * 1024**2
"""KV cache per instance, given as --kv-cache-memory-bytes (VLLM_CPU_KVCACHE_SPACE counts whole GiB and would
override it): the tiny model needs 512 bytes per token, so 64 MiB holds 64 full 2048-token sequences."""
LEAN_ARGS = ("--max-model-len", "2048", "--seed", "0", "--kv-cache-memory-bytes", str(KV_CACHE_BYTES))
"""What every e2e instance runs with. With --enforce-eager (set in tiny_server) and an explicit KV size vLLM skips
torch.compile and the warm-up pass: an instance is healthy in ~35 s instead of ~63 s and takes ~2 GB (PSS of its
three processes) instead of ~3 GB, which is what lets the tier run in CI's memory."""

VLLM_ENV = profile.CPU_VLLM_ENV
"""What every vLLM instance gets on top of the test's environment: the local profile's (shared/docs/facts.md)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect e2e tests unless the run asks for them (`-m` naming e2e, or a path under tests/e2e)."""
    markexpr = str(config.getoption("markexpr", "") or "")
    named = any("e2e" in str(arg) for arg in config.args)
    if "e2e" in markexpr or named:
        return
    keep = [item for item in items if item.get_closest_marker("e2e") is None]
    dropped = [item for item in items if item.get_closest_marker("e2e") is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def free_port() -> int:
    """A port nothing listens on right now (the kernel's pick; a tiny race is acceptable in tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def progress(config: pytest.Config) -> Callable[[str], None]:
    """Print a line on the terminal even while pytest captures output (instances take a minute to start)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")

    def say(line: str) -> None:
        if reporter is None or capture is None:  # pragma: no cover - plugins disabled
            print(f"[e2e] {line}", flush=True)
            return
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"[e2e] {line}")

    return say


@dataclass
class Timings:
    """Wall times and counts the tier measures (printed at the end of the session, each with its unit)."""

    entries: dict[str, tuple[float, str]] = field(default_factory=dict)

    def add(self, name: str, seconds: float) -> None:
        self.entries[name] = (seconds, "s")

    def count(self, name: str, value: int) -> None:
        self.entries[name] = (float(value), "")

    def milliseconds(self, name: str, value: float) -> None:
        self.entries[name] = (value, "ms")


TIMINGS = Timings()


@dataclass
class Stage:
    """The tier as a whole: its wall time (first e2e test's setup to the last instance stopped) and memory."""

    wall_s: float | None = None
    sampler: MemorySampler | None = None
    module: str = ""
    """The test module running now."""


STAGE = Stage()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TIMINGS.entries and STAGE.wall_s is None:
        return
    terminalreporter.section("e2e timings")
    for name, (value, unit) in TIMINGS.entries.items():
        figure = f"{value:8.1f} {unit}" if unit else f"{value:8.0f}"
        terminalreporter.write_line(f"{name:<56} {figure}")
    if STAGE.wall_s is not None:
        terminalreporter.write_line(f"{'e2e stage (wall)':<56} {STAGE.wall_s:8.1f} s")
    if STAGE.sampler is not None:
        for line in STAGE.sampler.report():
            terminalreporter.write_line(line)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Name the module now running for the memory sampler, before its fixtures start any instance."""
    STAGE.module = item.nodeid.split("::")[0]


@pytest.fixture(scope="session", autouse=True)
def e2e_stage(request: pytest.FixtureRequest) -> Iterator[None]:
    """Times the tier and samples memory while it runs. Set up before (and so torn down after) every other
    session fixture of the tier, so the wall time includes starting and stopping every instance."""
    progress(request.config)(cpu_summary())
    sampler = MemorySampler(lambda: STAGE.module)
    sampler.start()
    STAGE.sampler = sampler
    started = time.monotonic()
    try:
        yield
    finally:
        sampler.stop()
        STAGE.wall_s = time.monotonic() - started


@pytest.fixture(scope="session")
def e2e_python() -> Path:
    """The e2e venv's interpreter, or a failure that names the setup step."""
    python = E2E_VENV / "bin" / "python"
    if not python.exists() or not (E2E_VENV / ".epd-setup-stamp").exists():
        pytest.fail(f"the e2e virtualenv {E2E_VENV} is missing or incomplete: {SETUP_HINT}", pytrace=False)
    return python


@pytest.fixture(scope="session")
def tiny_model(e2e_python: Path) -> Path:
    """The tiny Qwen2-VL's folder (built once and cached; a few seconds when the script changed)."""
    started = time.monotonic()
    model = tiny_model_build(e2e_python, SETUP_HINT)
    TIMINGS.add("tiny model (build or cache hit)", time.monotonic() - started)
    return model


@dataclass
class VllmInstance:
    """One vLLM OpenAI server started by `epd-launch` from a bundle."""

    name: str
    bundle: RoleBundle
    popen: subprocess.Popen[bytes]
    log: Path
    started: float
    watch: LogWatch
    ready: bool = False
    """Seen healthy once (wait_healthy does not wait for it again)."""

    @property
    def port(self) -> int:
        assert self.bundle.vllm is not None
        return self.bundle.vllm.port

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def alive(self) -> bool:
        return self.popen.poll() is None

    def failure(self) -> str | None:
        """Why it failed (exited, or its log says vLLM's engine died while the API server lives on), or None."""
        return failures.failure(self.popen.poll(), self.watch.fatal())

    def tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def post(self, path: str, body: dict[str, Any], timeout_s: float = 120.0) -> dict[str, Any]:
        """POST JSON; the parsed answer, or a failure with the status, the body and the log's tail."""
        answer: dict[str, Any] = json.loads(self._post(path, body, timeout_s))
        return answer

    def post_stream(self, path: str, body: dict[str, Any], timeout_s: float = 120.0) -> list[dict[str, Any]]:
        """POST a streamed request; the server-sent events' JSON payloads up to [DONE]."""
        events: list[dict[str, Any]] = []
        for line in self._post(path, {**body, "stream": True}, timeout_s).decode().splitlines():
            if not line.startswith("data: "):
                continue
            payload = line.removeprefix("data: ").strip()
            if payload == "[DONE]":
                return events
            events.append(json.loads(payload))
        pytest.fail(f"{self.name}: the stream of POST {path} ended without [DONE]: {events[-3:]}")

    def _post(self, path: str, body: dict[str, Any], timeout_s: float) -> bytes:
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                data: bytes = response.read()
                return data
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:2000]
            pytest.fail(f"{self.name}: POST {path} -> HTTP {exc.code}: {detail}\n--- log ---\n{self.tail()}")

    def stop(self) -> None:
        """SIGTERM to the process group (API server and engine core), SIGKILL after 20 s."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # stragglers of the group, if any
        self.popen.wait(timeout=10)


def vllm_bundle(name: str, server: VllmServerConfig, ec: ECExampleConnectorConfig | None = None) -> RoleBundle:
    """The bundle the operator would render for one vLLM role of a deployment called e2e."""
    role = {"encoder": Role.ENCODER, "prefill": Role.PREFILL, "decode": Role.DECODE, "pd": Role.PD}[server.role]
    return RoleBundle(deployment=f"e2e-{name}", role=role, vllm=server, ec_transfer=ec)


def tiny_server(model: Path, role: str, **overrides: Any) -> VllmServerConfig:
    """The server settings every e2e instance shares: loopback, a free port, bf16, 32-token blocks, eager, a
    64 MiB KV cache (LEAN_ARGS)."""
    settings: dict[str, Any] = {
        "role": role,
        "model": str(model),
        "served_model_name": SERVED_MODEL,
        "host": LOOPBACK,
        "port": free_port(),
        "dtype": "bfloat16",
        "block_size": 32,
        "enforce_eager": True,
        "extra_args": LEAN_ARGS,
    }
    settings.update(overrides)
    return VllmServerConfig.model_validate(settings)


class Launcher:
    """Starts instances through `epd-launch`, waits for them together, stops them all at the end."""

    def __init__(self, python: Path, workdir: Path, say: Callable[[str], None]) -> None:
        self.python = python
        self.workdir = workdir
        self.say = say
        self.instances: list[VllmInstance] = []

    def start(self, name: str, bundle: RoleBundle) -> VllmInstance:
        folder = self.workdir / name
        folder.mkdir(parents=True, exist_ok=True)
        bundle_path = folder / "bundle.json"
        bundle_path.write_text(bundle.to_json(), encoding="utf-8")
        log = folder / "vllm.log"
        env = {
            **os.environ,
            **VLLM_ENV,
            # Its own compile cache: this build cannot load a cached AOT compile ("'function' object has no
            # attribute 'finalize_loading'") and recompiles anyway, and instances sharing one cache race on it.
            "VLLM_CACHE_ROOT": str(folder / "vllm-cache"),
            "PATH": f"{self.python.parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "VIRTUAL_ENV": str(self.python.parent.parent),
        }
        argv = [str(self.python), "-m", "epd_connectors.launch.cli", bundle.role.value]
        argv += ["--bundle", str(bundle_path), "--workdir", str(folder / "launch")]
        with log.open("wb") as out:
            popen = subprocess.Popen(  # stopped by stop(); a new session so the group can be signalled
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=folder, start_new_session=True
            )
        instance = VllmInstance(name, bundle, popen, log, time.monotonic(), LogWatch(log))
        self.instances.append(instance)
        self.say(f"{name}: started {bundle.role.value} on port {instance.port} (log {log})")
        return instance

    def wait_healthy(self, instances: list[VllmInstance], deadline_s: float = START_DEADLINE_S) -> None:
        """Wait until every instance answers /health; progress every 15 s; fail with the log of the culprit.
        An instance seen healthy before is not waited for (nor timed) again."""
        pending = [instance for instance in instances if not instance.ready]
        last_note = time.monotonic()
        while pending:
            for instance in list(pending):
                elapsed = time.monotonic() - instance.started
                if (why := instance.failure()) is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        instance.popen.wait(timeout=2)  # the rest of its traceback
                    instance.stop()
                    pytest.fail(
                        f"{instance.name} failed before it was healthy: {why}; log {instance.log}:\n{instance.tail()}",
                        pytrace=False,
                    )
                if instance.healthy():
                    pending.remove(instance)
                    instance.ready = True
                    TIMINGS.add(f"start {instance.name}", elapsed)
                    self.say(f"{instance.name}: healthy after {elapsed:.0f}s{attention_note(instance.log, 0)}")
                elif elapsed > deadline_s:
                    pytest.fail(
                        f"{instance.name} not healthy after {deadline_s:.0f}s; log {instance.log}:\n{instance.tail()}",
                        pytrace=False,
                    )
            if pending and time.monotonic() - last_note > 15:
                last_note = time.monotonic()
                names = ", ".join(f"{i.name} ({time.monotonic() - i.started:.0f}s)" for i in pending)
                self.say(f"waiting for /health: {names}")
            time.sleep(0.5)

    def stop_each(self, instances: list[VllmInstance]) -> None:
        """Stop these instances together (a group's teardown, so the next group never overlaps it in memory)."""
        running = [i.name for i in instances if i.alive()]
        with ThreadPoolExecutor(max_workers=max(1, len(instances))) as pool:
            list(pool.map(lambda i: i.stop(), instances))
        if running:
            self.say(f"stopped {', '.join(running)}")

    def stop_all(self) -> None:
        self.stop_each(self.instances)


@pytest.fixture(scope="session")
def launcher(
    request: pytest.FixtureRequest, e2e_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Launcher]:
    """Starts vLLM instances from bundles for the whole session; stops every one of them at the end and, when a
    test failed, prints the tail of each log."""
    say = progress(request.config)
    launcher = Launcher(e2e_python, tmp_path_factory.mktemp("vllm"), say)
    try:
        yield launcher
    finally:
        launcher.stop_all()
        if request.session.testsfailed:
            for instance in launcher.instances:
                say(f"--- {instance.name} log tail ({instance.log}) ---\n{instance.tail(40)}")


@pytest.fixture(scope="session")
def baseline_started(launcher: Launcher, tiny_model: Path) -> VllmInstance:
    """The single-instance reference every fidelity test compares with: a plain PD, no connector, the same model
    and settings as every other instance. One for the whole session, started on first use but not waited for:
    a fixture that starts instances of its own asks for this one and waits for all of them together (on 2 cores
    three instances starting at once are healthy sooner than one and then two)."""
    return launcher.start("baseline", vllm_bundle("baseline", tiny_server(tiny_model, "pd")))


@pytest.fixture(scope="session")
def baseline(launcher: Launcher, baseline_started: VllmInstance) -> VllmInstance:
    """The baseline, healthy."""
    launcher.wait_healthy([baseline_started])
    return baseline_started


@contextlib.contextmanager
def local_example(
    request: pytest.FixtureRequest, plan: LocalPlan, workdir: Path, python: Path, label: str
) -> Iterator[LocalDeployment]:
    """`plan` (an example the local runner planned) started and ready, stopped on the way out; the tail of every
    role's log is printed when a test of the session failed."""
    say = progress(request.config)
    with processes.deployment(plan, workdir, python, say=lambda line: say(f"{label}: {line}")) as local:
        try:
            yield local
        finally:
            if request.session.testsfailed:
                for run in local.running:
                    say(f"--- {run.name} log tail ({run.log}) ---\n{run.tail(30)}")


def greedy_chat(content: str | list[dict[str, Any]], max_tokens: int, *, stream: bool | None = None) -> dict[str, Any]:
    """A greedy chat request that always produces `max_tokens` tokens (random weights rarely stop by themselves),
    with logprobs so answers compare token by token; `stream` is sent only when given."""
    body: dict[str, Any] = {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "logprobs": True,
        "seed": 0,
    }
    if stream is not None:
        body["stream"] = stream
    return body


def image_data_url(width: int = 64, height: int = 64, seed: int = 0) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(width, height, seed)).decode()
