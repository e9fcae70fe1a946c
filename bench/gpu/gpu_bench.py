"""The GPU run of bench/gpu: the project's own stacks on one GPU, checked against one vLLM instance, then timed.

Run by bench/gpu/run_gpu.sh on the GPU machine (vLLM, Mooncake and epd-connectors on PYTHONPATH, operator/src
and tools/local/src beside them). Every stack is rendered by the operator's own functions through the local runner
(a loopback `Site`, `plan_on_free_ports`) and every role starts through `epd-launch`, as `make demo-local` does;
only the profile differs: `gpu_profile` below instead of the CPU one (no CPU env, no block size, the GPU's EC
buffer).

Phases (each writes into results.json as it ends, so a run stopped by the call's time limit keeps what it did):
- correctness, on the tiny Qwen2-VL: one plain vLLM instance (the PD bundle's own server flags, no connector)
  is the reference; E+PD (ECExampleConnector) and E+P+D (ECExampleConnector, MooncakeConnector KV P2P plus
  MooncakeStoreConnector into a real mooncake_master and store client) must answer every request equal to it,
  greedy, streamed and not, also with 8 requests in flight. mooncake_gpu.py then moves GPU memory through the
  transfer engine and puts and gets GPU memory through the running stack's store.
- timing, on a Qwen2-VL-7B-shaped model with random weights (`--load-format dummy`): `vllm bench serve`
  against one instance and against E+PD on the same GPU, text-only and with images.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epd_connectors.config.roles import Role
from epd_connectors.config.vllm import SERVER_MODULE
from epd_connectors.launch.plan import plan_launch
from epd_local import processes, profile, sample
from epd_local.plan import POD_IP, LocalPlan, Readiness
from epd_local.profile import LocalProfile

HERE = Path(__file__).resolve().parent
GIB = 1024**3
STARTED = time.monotonic()

GPU_VLLM_ENV = dict(profile.QUIET_VLLM_ENV)
"""The local profile's env less its CPU settings (threads, no torch.compile): no hub, no usage reports, a
traceback on a fatal signal."""


def gpu_profile(kv_cache_bytes: int, *, enforce_eager: bool) -> LocalProfile:
    """The local runner's profile for one GPU shared by every instance: each vLLM role gets a fixed KV size
    (vLLM then skips its memory profiling, which other instances starting on the same GPU would skew); the
    manifests give each a small --gpu-memory-utilization, which vLLM 0.26 only checks against free memory at
    start. Block size, EC buffer device and store sizes stay as the manifest says."""
    return LocalProfile(
        block_size=None,
        ec_buffer_device=None,
        ec_buffer_bytes=None,
        store_protocol=None,
        vllm_env=dict(GPU_VLLM_ENV),
        enforce_eager=enforce_eager,
        kv_cache_bytes=kv_cache_bytes,
        store_segment_bytes=None,
        store_buffer_bytes=None,
        one_instance_per_role=True,
    )


def log(line: str) -> None:
    print(f"[{time.monotonic() - STARTED:6.1f}s] {line}", flush=True)


# ---------------------------------------------------------------------------------------------- HTTP helpers


def http_get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return str(response.read().decode(errors="replace"))


def chat(endpoint: str, body: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
    """One chat completion: the text, the completion token count, or the error."""
    started = time.monotonic()
    try:
        answer = sample.ask(endpoint, body, timeout_s=timeout)
        usage = answer.get("usage") or {}
        return {
            "text": sample.answer_text(answer),
            "tokens": usage.get("completion_tokens"),
            "seconds": round(time.monotonic() - started, 3),
        }
    except (RuntimeError, OSError, KeyError, ValueError) as exc:
        return {"error": str(exc)[:600], "seconds": round(time.monotonic() - started, 3)}


def chat_stream(endpoint: str, body: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
    """The same request streamed (server-sent events): the deltas joined, the chunk count, time to first chunk."""
    started = time.monotonic()
    request = urllib.request.Request(
        f"{endpoint}/v1/chat/completions",
        data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    parts: list[str] = []
    chunks = 0
    first: float | None = None
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            for raw in response:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                for choice in event.get("choices") or []:
                    delta = (choice.get("delta") or {}).get("content")
                    if delta:
                        if first is None:
                            first = time.monotonic() - started
                        parts.append(delta)
                        chunks += 1
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:600]
        return {"error": f"HTTP {exc.code}: {detail}", "seconds": round(time.monotonic() - started, 3)}
    except (OSError, ValueError) as exc:
        return {"error": str(exc)[:600], "seconds": round(time.monotonic() - started, 3)}
    return {
        "text": "".join(parts),
        "chunks": chunks,
        "first_chunk_s": round(first, 3) if first is not None else None,
        "seconds": round(time.monotonic() - started, 3),
    }


def body_for(model: str, kind: str) -> dict[str, Any]:
    """ "text", or "imageN": the runner's sample request with the 64x64 test image of seed N; greedy, 16 tokens."""
    if kind == "text":
        return sample.chat_body(model, image=False)
    body = sample.chat_body(model, image=True)
    seed = int(kind.removeprefix("image"))
    body["messages"][0]["content"][0]["image_url"]["url"] = sample.image_data_url(seed)
    return body


def metric_lines(url: str, pattern: str, limit: int = 80) -> list[str]:
    """The Prometheus samples of `url` whose line matches `pattern` (comments dropped)."""
    try:
        text = http_get(url)
    except OSError as exc:
        return [f"unreachable: {exc}"]
    wanted = re.compile(pattern)
    return [line for line in text.splitlines() if not line.startswith("#") and wanted.search(line)][:limit]


# -------------------------------------------------------------------------------------------- the processes


@dataclass
class Single:
    """One plain vLLM instance: the generating role's own rendered server flags without any connector."""

    name: str
    argv: list[str]
    env: dict[str, str]
    port: int
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ready_after: float | None = None
    error: str | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{POD_IP}:{self.port}"

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        log(f"start {self.name}: python -m {SERVER_MODULE} {' '.join(self.argv[3:])}")
        with self.log.open("wb") as out:
            self.started = time.monotonic()
            self.popen = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )

    def wait(self, deadline_s: float) -> None:
        assert self.popen is not None
        while self.ready_after is None and self.error is None:
            elapsed = time.monotonic() - self.started
            if self.popen.poll() is not None:
                self.error = f"exited with {self.popen.returncode} after {elapsed:.0f}s; log {self.log}"
            elif processes.is_ready(Readiness(url=f"{self.endpoint}/health")):
                self.ready_after = elapsed
                log(f"ready {self.name} after {elapsed:.0f}s")
            elif elapsed > deadline_s:
                self.error = f"not ready after {deadline_s:.0f}s; log {self.log}"
            else:
                time.sleep(0.5)
        if self.error:
            log(f"{self.name}: {self.error}")

    def stop(self) -> None:
        if self.popen is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=processes.STOP_GRACE_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen = None


@dataclass
class Stack:
    """One EPDDeployment manifest run by the local runner with the GPU profile."""

    name: str
    manifest: Path
    model: Path
    profile: LocalProfile
    base_port: int
    workdir: Path
    plan: LocalPlan | None = None
    local: processes.LocalDeployment | None = None
    error: str | None = None

    def start(self) -> None:
        self.plan = processes.plan_on_free_ports(self.manifest, self.workdir, self.model, self.profile, self.base_port)
        log(f"start {self.name} ({self.manifest.name}); profile changes: {'; '.join(self.plan.profile_changes)}")
        for instance in self.plan.instances:
            ports = " ".join(f"{k}={v}" for k, v in instance.ports.items())
            log(f"    {instance.name:<34} {instance.role.value:<13} {ports}")
        self.local = processes.LocalDeployment(self.plan, self.workdir, Path(sys.executable), say=log)
        self.local.start()

    def wait(self, deadline_s: float) -> None:
        assert self.local is not None
        try:
            self.local.wait_ready(deadline_s)
        except processes.StartError as exc:
            self.error = f"{exc}\n{exc.log_tail}"
            log(f"{self.name}: {exc}")

    def stop(self) -> None:
        if self.local is not None:
            self.local.stop()

    @property
    def ok(self) -> bool:
        return self.local is not None and self.error is None

    def single(self, name: str, port: int, workdir: Path) -> Single:
        """The reference instance of this stack: its PD (or decode) bundle's server flags, no EC/KV connector,
        the same environment epd-launch gives that role."""
        assert self.plan is not None
        generating = next(i for i in self.plan.instances if i.role in (Role.PD, Role.DECODE))
        server = generating.bundle.vllm
        assert server is not None
        server = server.model_copy(update={"port": port})
        launch = plan_launch(generating.bundle, workdir=str(workdir), bundle_path="-", environ={"POD_IP": POD_IP})
        env = {**os.environ, **{k: v for k, v in launch.env.items() if k != "MOONCAKE_CONFIG_PATH"}}
        env["VLLM_CACHE_ROOT"] = str(workdir / "vllm-cache")
        env["VLLM_RPC_BASE_PATH"] = f"/tmp/epd-rpc-{port}"
        Path(env["VLLM_RPC_BASE_PATH"]).mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", SERVER_MODULE, *server.argv(None, None)]
        return Single(name, argv, env, port, workdir / "log.txt")

    def endpoint(self) -> str:
        assert self.plan is not None
        return self.plan.endpoint

    def instance_urls(self) -> dict[str, str]:
        """Every vLLM instance's base URL, by name."""
        assert self.plan is not None
        return {
            i.name: f"http://{POD_IP}:{i.bundle.vllm.port}" for i in self.plan.instances if i.bundle.vllm is not None
        }


def stop_all(things: list[Any]) -> None:
    with ThreadPoolExecutor(max_workers=max(1, len(things))) as pool:
        list(pool.map(lambda t: t.stop(), things))


# ------------------------------------------------------------------------------------------------- models


def real_size_model(tiny: Path, out: Path) -> dict[str, Any]:
    """A Qwen2-VL-7B-shaped model folder without weights (served with --load-format dummy): the tiny model's
    tokenizer and processors, its config.json with Qwen2-VL-7B's sizes, images allowed up to 1280 tokens.
    The vocabulary stays the tiny tokenizer's 400 tokens (the 7B has 152064): every sampled id then decodes."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for path in tiny.iterdir():
        if path.is_file() and not path.name.endswith(".safetensors") and path.name != "model.safetensors.index.json":
            shutil.copy2(path, out / path.name)
    config: dict[str, Any] = json.loads((tiny / "config.json").read_text())
    text_sizes = {
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
    }
    vision_sizes = {"depth": 32, "embed_dim": 1280, "hidden_size": 3584, "mlp_ratio": 4, "num_heads": 16}
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    text.update(text_sizes)
    text.pop("head_dim", None)
    for section in (text, config):  # transformers 5 checks one layer type per layer
        if isinstance(section.get("layer_types"), list) and section["layer_types"]:
            section["layer_types"] = [section["layer_types"][0]] * text_sizes["num_hidden_layers"]
    rope = text.get("rope_parameters") or text.get("rope_scaling")
    if isinstance(rope, dict):
        rope["mrope_section"] = [16, 24, 24]
    for key, value in text_sizes.items():  # transformers may mirror text sizes at the top level
        if key in config and config is not text:
            config[key] = value
    config["tie_word_embeddings"] = False
    config["vision_config"].update(vision_sizes)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    max_pixels = 1280 * 28 * 28

    def widen(node: Any) -> None:
        if isinstance(node, dict):
            for key in list(node):
                if key in ("max_pixels", "longest_edge"):
                    node[key] = max_pixels
                else:
                    widen(node[key])
        elif isinstance(node, list):
            for item in node:
                widen(item)

    for name in ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json"):
        path = out / name
        if path.exists():
            data = json.loads(path.read_text())
            widen(data)
            path.write_text(json.dumps(data, indent=2))
    return config


# ------------------------------------------------------------------------------------------------ results


@dataclass
class Results:
    path: Path
    data: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def put(self, key: str, value: Any) -> None:
        with self.lock:
            self.data[key] = value
            self.path.write_text(json.dumps(self.data, indent=2, default=str))


LOG_PATTERNS = re.compile(
    r"ECExampleConnector|Save cache|Success load|[Mm]ooncake|KV Transfer|External prefix cache hit rate|"
    r"Traceback|Error|attention backend|Using .*backend|FLASH|V2 [Mm]odel [Rr]unner|does not yet support|"
    r"epd-launch|epd_connectors|Available KV cache|kv_cache_memory_bytes|Loading weights took|init engine"
)


def runner_of(log_file: Path) -> str:
    """Which model runner a vLLM instance's log says it used (vLLM 0.26 takes V2 unless something forbids it)."""
    text = log_file.read_text(errors="replace") if log_file.exists() else ""
    if "Using V2 Model Runner" in text:
        return "V2"
    return "V1" if "Initializing a V1 LLM engine" in text else "-"


def log_digest(path: Path, limit: int = 60) -> list[str]:
    if not path.exists():
        return ["(no log)"]
    lines = path.read_text(errors="replace").splitlines()
    hits = [line[:400] for line in lines if LOG_PATTERNS.search(line)]
    return [f"({len(lines)} lines)", *hits[:limit]]


# -------------------------------------------------------------------------------------------------- phases


def correctness(args: argparse.Namespace, results: Results) -> None:
    """The tiny model: the reference instance, E+PD and E+P+D started together, then the same requests."""
    work = args.workdir / "tiny"
    profile = gpu_profile(1 * GIB, enforce_eager=True)
    stacks = [
        Stack("E+PD", HERE / "e-pd.yaml", args.model, profile, 21000, work / "e-pd"),
        Stack("E+P+D", HERE / "e-p-d.yaml", args.model, profile, 22000, work / "e-p-d"),
    ]
    for stack in stacks:
        stack.start()
    reference = stacks[0].single("single", 23000, work / "single")
    reference.start()
    started: list[Any] = [*stacks, reference]
    try:
        deadline = args.start_deadline
        reference.wait(deadline)
        for stack in stacks:
            stack.wait(deadline)
        results.put(
            "correctness_start",
            {
                "single": {"ready_after_s": reference.ready_after, "error": reference.error},
                **{
                    s.name: {
                        "error": s.error,
                        "ready_after_s": {r.name: r.ready_after for r in (s.local.running if s.local else [])},
                        "profile_changes": s.plan.profile_changes if s.plan else None,
                    }
                    for s in stacks
                },
            },
        )
        if reference.error:
            return
        model = stacks[0].plan.served_model if stacks[0].plan else "tiny-qwen2-vl"
        kinds = ["image0", "image1", "text"]
        ref = {k: chat(reference.endpoint, body_for(model, k)) for k in kinds}
        ref_stream = {k: chat_stream(reference.endpoint, body_for(model, k)) for k in kinds}
        busy_kinds = [f"image{n}" for n in range(2, 10)]
        ref_busy = {k: chat(reference.endpoint, body_for(model, k)) for k in busy_kinds}
        out: dict[str, Any] = {
            "reference": {"answers": ref, "streamed": ref_stream, "in_flight_8": ref_busy},
            "reference_stream_equal": all(same(ref[k], ref_stream[k]) for k in kinds),
        }
        for stack in stacks:
            if not stack.ok:
                out[stack.name] = {"error": stack.error}
                continue
            endpoint = stack.endpoint()
            answers = {k: chat(endpoint, body_for(model, k)) for k in kinds}
            streamed = {k: chat_stream(endpoint, body_for(model, k)) for k in kinds}
            busy = in_flight(endpoint, model, busy_kinds)
            equal = {k: same(answers[k], ref[k]) and same(streamed[k], ref[k]) for k in kinds}
            equal_busy = {k: same(busy[k], ref_busy[k]) for k in busy_kinds}
            out[stack.name] = {
                "endpoint": endpoint,
                "answers": answers,
                "streamed": streamed,
                "in_flight_8": busy,
                "equal": equal,
                "equal_in_flight_8": equal_busy,
                "all_equal": all(equal.values()) and all(equal_busy.values()),
            }
            log(f"{stack.name}: equal to the single instance: {equal} in flight: {all(equal_busy.values())}")
        results.put("correctness", out)
        evidence(stacks, args, results)
    finally:
        logs = {"single": reference.log, **{r.name: r.log for s in stacks if s.local for r in s.local.running}}
        stop_all(started)
        results.put("correctness_logs", {name: log_digest(path) for name, path in logs.items()})


def same(answer: dict[str, Any], reference: dict[str, Any]) -> bool:
    """Both answered, with the same text."""
    return answer.get("text") is not None and answer.get("text") == reference.get("text")


def in_flight(endpoint: str, model: str, kinds: list[str]) -> dict[str, Any]:
    """The requests all at once (one thread each); the answers by kind."""
    with ThreadPoolExecutor(max_workers=len(kinds)) as pool:
        answers = list(pool.map(lambda kind: chat(endpoint, body_for(model, kind)), kinds))
    return dict(zip(kinds, answers, strict=True))


def evidence(stacks: list[Stack], args: argparse.Namespace, results: Results) -> None:
    """What shows where the data went: EC files, the store master's counters, the vLLM and proxy metrics, and
    mooncake_gpu.py against the E+P+D stack's store (GPU memory through the transfer engine and the store)."""
    time.sleep(11)  # vLLM logs its periodic stats (with the KV connector's) every 10 s
    out: dict[str, Any] = {}
    for stack in stacks:
        if not stack.ok or stack.plan is None:
            continue
        entry: dict[str, Any] = {}
        ec_dir = Path(stack.plan.paths.shared_dir) / "ec"
        files = [p for p in ec_dir.rglob("*") if p.is_file()] if ec_dir.exists() else []
        entry["ec_files"] = {"count": len(files), "bytes": sum(p.stat().st_size for p in files)}
        entry["vllm_metrics"] = {
            name: metric_lines(
                f"{url}/metrics", r"prefix_cache|kv_transfer|external|connector|prompt_tokens_by|encoder_cache|ec_"
            )
            for name, url in stack.instance_urls().items()
        }
        entry["proxy_metrics"] = metric_lines(f"{stack.endpoint()}/metrics", r"^epd_proxy", limit=120)
        for instance in stack.plan.instances:
            if instance.bundle.master is not None:
                port = instance.bundle.master.metrics_port
                entry["master_metrics"] = metric_lines(f"http://{POD_IP}:{port}/metrics", r".", limit=200)
                master = f"{POD_IP}:{instance.bundle.master.rpc_port}"
                entry["mooncake_gpu"] = run_json(
                    [sys.executable, str(HERE / "mooncake_gpu.py"), "--master", master], timeout=120
                )
        out[stack.name] = entry
    if "E+P+D" not in out:
        out["mooncake_gpu_engine_only"] = run_json([sys.executable, str(HERE / "mooncake_gpu.py")], timeout=90)
    results.put("evidence", out)


def run_json(argv: list[str], timeout: float) -> Any:
    """Run a helper that prints one JSON line last; its value, or what went wrong."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        return {"error": f"timed out after {timeout}s", "stderr": str(exc.stderr)[-2000:]}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": f"rc={done.returncode}", "stdout": done.stdout[-2000:], "stderr": done.stderr[-3000:]}
    value: Any = json.loads(lines[-1])
    return value


VLLM_CLI = "import sys; from vllm.entrypoints.cli.main import main; sys.exit(main())"
"""The `vllm` command (its module has no __main__ block): sys.argv[1:] are its arguments."""

BENCH_KEYS = (
    "completed",
    "failed",
    "duration",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "mean_itl_ms",
    "mean_e2el_ms",
)


def bench(
    url: str, model_dir: Path, served: str, workload: dict[str, Any], *, out_dir: Path, tag: str
) -> dict[str, Any]:
    """One `vllm bench serve` run (vLLM's own client) against `url`; the figures it saved."""
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-c",
        VLLM_CLI,
        "bench",
        "serve",
        "--backend",
        "openai-chat",
        "--endpoint",
        "/v1/chat/completions",
        "--base-url",
        url,
        "--model",
        str(model_dir),
        "--served-model-name",
        served,
        "--seed",
        "0",
        "--ignore-eos",
        "--temperature",
        "0",
        "--num-warmups",
        "2",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(out_dir),
        "--result-filename",
        f"{tag}.json",
        *workload["args"],
    ]
    started = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=workload.get("timeout", 150), check=False)
    except subprocess.TimeoutExpired:
        return {"error": "timed out", "seconds": round(time.monotonic() - started, 1)}
    (out_dir / f"{tag}.log").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    saved = out_dir / f"{tag}.json"
    if done.returncode != 0 or not saved.exists():
        return {"error": f"rc={done.returncode}", "tail": (done.stdout + done.stderr)[-1500:]}
    data = json.loads(saved.read_text())
    figures = {k: data.get(k) for k in BENCH_KEYS}
    figures["seconds"] = round(time.monotonic() - started, 1)
    return figures


ONE_IMAGE_ARGS = (
    "--dataset-name",
    "random-mm",
    "--random-input-len",
    "128",
    "--random-output-len",
    "128",
    "--random-mm-base-items-per-request",
    "1",
    "--random-mm-num-mm-items-range-ratio",
    "0",
    "--random-mm-limit-mm-per-prompt",
    '{"image": 1, "video": 0}',
    "--random-mm-bucket-config",
    "{(448, 448, 1): 1.0}",
)
"""`vllm bench serve`'s traffic of one 448x448 image and 128 text tokens in, 128 out (both image workloads)."""


WORKLOADS: list[dict[str, Any]] = [
    {
        "name": "text, 1024 in / 128 out, 64 requests, 16 in flight",
        "key": "text-c16",
        "args": [
            "--dataset-name",
            "random",
            "--random-input-len",
            "1024",
            "--random-output-len",
            "128",
            "--num-prompts",
            "64",
            "--max-concurrency",
            "16",
        ],
    },
    {
        "name": "one 448x448 image (256 image tokens) + 128 text tokens in / 128 out, 64 requests, 16 in flight",
        "key": "image-c16",
        "args": [
            *ONE_IMAGE_ARGS,
            "--num-prompts",
            "64",
            "--max-concurrency",
            "16",
        ],
    },
    {
        "name": "the same image requests one at a time (16 requests)",
        "key": "image-c1",
        "args": [
            *ONE_IMAGE_ARGS,
            "--num-prompts",
            "16",
            "--max-concurrency",
            "1",
        ],
    },
]


@dataclass
class Timing:
    """The timing phase's processes, started before the correctness phase so that their start overlaps it."""

    stack: Stack
    reference: Single
    model_dir: Path


def timing_start(args: argparse.Namespace, results: Results) -> Timing:
    """The Qwen2-VL-7B-shaped model, random weights: one instance and E+PD on the same GPU, started together."""
    work = args.workdir / "timing"
    model_dir = args.workdir / "model-7b"
    config = real_size_model(args.model, model_dir)
    results.put("timing_model", {"text_config": config.get("text_config"), "vision_config": config["vision_config"]})
    profile = gpu_profile(args.kv_gib_7b * GIB, enforce_eager=args.eager_7b)
    stack = Stack("E+PD 7B", HERE / "e-pd-7b.yaml", model_dir, profile, 24000, work / "e-pd")
    stack.start()
    reference = stack.single("single 7B", 25000, work / "single")
    reference.env.update(item.split("=", 1) for item in args.single_env)
    reference.start()
    return Timing(stack, reference, model_dir)


def timing(args: argparse.Namespace, results: Results, started: Timing) -> None:
    """Each workload against the one instance, then against E+PD, while the other idles."""
    stack, reference = started.stack, started.reference
    try:
        reference.wait(args.start_deadline)
        stack.wait(args.start_deadline)
        runners = {"single": reference.log, **{r.name: r.log for r in (stack.local.running if stack.local else [])}}
        results.put(
            "timing_start",
            {
                "single": {"ready_after_s": reference.ready_after, "error": reference.error},
                "E+PD": {
                    "error": stack.error,
                    "ready_after_s": {r.name: r.ready_after for r in (stack.local.running if stack.local else [])},
                    "profile_changes": stack.plan.profile_changes if stack.plan else None,
                },
                "argv_single": reference.argv[3:],
                "env_single": args.single_env,
                "model_runner": {name: runner_of(path) for name, path in runners.items()},
            },
        )
        served = stack.plan.served_model if stack.plan else "qwen2-vl-7b-random"
        targets = {"single": (reference.error is None, reference.endpoint)}
        targets["E+PD"] = (stack.ok, stack.endpoint() if stack.plan else "")
        table: dict[str, Any] = {}
        for workload in WORKLOADS:
            row: dict[str, Any] = {"workload": workload["name"]}
            for target, (ok, url) in targets.items():
                if not ok:
                    row[target] = {"error": "not running"}
                    continue
                if time.monotonic() - STARTED > args.time_budget:
                    row[target] = {"error": "skipped: the call's time budget is spent"}
                    continue
                tag = f"{workload['key']}-{target.replace('+', '')}"
                log(f"bench {tag}")
                row[target] = bench(url, started.model_dir, served, workload, out_dir=args.out / "bench", tag=tag)
                log(f"    {row[target]}")
            table[workload["key"]] = row
            results.put("timing", table)
    finally:
        logs = {"single": reference.log, **{r.name: r.log for r in (stack.local.running if stack.local else [])}}
        stop_all([stack, reference])
        results.put("timing_logs", {name: log_digest(path) for name, path in logs.items()})


def pack_logs(args: argparse.Namespace) -> None:
    """Every instance's log (and the benches' outputs) into one archive: the device tool returns 8 files."""
    with tarfile.open(args.out / "logs.tar.gz", "w:gz") as tar:
        for path in sorted(args.workdir.rglob("*")):
            if path.is_file() and (path.name in ("log.txt", "bundle.json") or path.suffix == ".log"):
                tar.add(path, arcname=str(path.relative_to(args.workdir)))
        bench_dir = args.out / "bench"
        if bench_dir.exists():
            tar.add(bench_dir, arcname="bench")
    shutil.rmtree(args.out / "bench", ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("phases", nargs="*", default=["correctness", "timing"], help="correctness, timing")
    parser.add_argument("--model", type=Path, required=True, help="the tiny Qwen2-VL folder")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/epd-gpu/work"))
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/epd-gpu/out")))
    parser.add_argument("--start-deadline", type=float, default=300.0, help="seconds for a phase's processes")
    parser.add_argument("--time-budget", type=float, default=540.0, help="no new bench after this many seconds")
    parser.add_argument("--kv-gib-7b", type=int, default=12, help="KV cache of each 7B instance")
    parser.add_argument("--eager-7b", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--single-env", action="append", default=[], help="KEY=VALUE for the timed single instance (repeatable)"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.workdir.mkdir(parents=True, exist_ok=True)
    results = Results(args.out / "results.json")
    results.put("started", time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    early: Timing | None = None
    try:
        if "timing" in args.phases:
            try:
                early = timing_start(args, results)
            except Exception as exc:  # the correctness phase still runs
                log(f"timing start failed: {exc!r}")
                results.put("timing_failure", repr(exc))
        for name in args.phases:
            log(f"phase {name}")
            t0 = time.monotonic()
            try:
                if name == "correctness":
                    correctness(args, results)
                elif name == "timing" and early is not None:
                    timing(args, results, early)
                    early = None
            except Exception as exc:  # one phase's failure must not lose the others' results
                log(f"phase {name} failed: {exc!r}")
                results.put(f"{name}_failure", repr(exc))
            results.put(f"{name}_seconds", round(time.monotonic() - t0, 1))
    finally:
        if early is not None:
            stop_all([early.stack, early.reference])
        pack_logs(args)
        log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
