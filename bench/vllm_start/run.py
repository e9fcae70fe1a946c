"""How long a new CPU vLLM instance of the tiny model takes to serve: with and without torch.compile in its sampler,
and with its worker in a process of its own or in the engine core's.

--enforce-eager turns off vLLM's compile of the model, but the sampler's logprobs op is still a torch.compile
function (vllm/v1/sample/ops/logprobs.py, the CPU platform's simple_compile_backend "inductor"): its first run
generates C++ and builds it with g++, into TorchInductor's cache. Local instances of one user share that cache
(/tmp/torchinductor_<user>); every new pod starts with an empty one. Each round starts the server (the local
profile's environment, a fresh inductor cache) in each mode: TORCHDYNAMO_DISABLE unset (compile) and =1 (the
profile's), and =1 with VLLM_ENABLE_V1_MULTIPROCESSING=0. By default the CPU platform runs the one worker of a
single-device instance in a process of its own (the "mp" executor); with that variable at 0 it keeps the "uni"
executor, the worker inside the engine core's process, as a single-GPU instance has it (the API server still runs
the engine core apart). It prints the seconds until /health answers and until the first greedy chat with logprobs
is answered, the files TorchInductor wrote, the Python processes serving, and whether every mode answered the same
tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from epd_local.profile import CPU_VLLM_ENV
from epd_testenv.process import free_ports

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL_SCRIPT = ROOT / "tools" / "tinymodel" / "make_tiny_qwen2vl.py"
START_TIMEOUT_S = 900.0
MODES: dict[str, dict[str, str]] = {
    "compile": {},
    "TORCHDYNAMO_DISABLE=1": {"TORCHDYNAMO_DISABLE": "1"},
    "TORCHDYNAMO_DISABLE=1, worker in the engine core": {
        "TORCHDYNAMO_DISABLE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    },
}
MODE_KEYS = frozenset(key for env in MODES.values() for key in env)
"""Left to each mode, whatever the local profile sets."""


def chat(port: int) -> list[str]:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Tell me a story about a lighthouse."}],
        "max_tokens": 12,
        "temperature": 0.0,
        "ignore_eos": True,
        "logprobs": True,
        "seed": 0,
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as answer:
        choice: dict[str, Any] = json.loads(answer.read())["choices"][0]
    return [entry["token"] for entry in choice["logprobs"]["content"]]


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def python_processes(session: int) -> int:
    """The Python processes of a process session (the server and the engine and worker processes it spawned)."""
    count = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            executable = (stat.parent / "exe").readlink().name
        except OSError:
            continue
        if int(text.rsplit(")", 1)[1].split()[3]) == session and executable.startswith("python"):
            count += 1
    return count


def start_and_ask(
    python: Path, model: Path, workdir: Path, extra_env: dict[str, str]
) -> tuple[float, float, int, list[str], int]:
    """(seconds to /health, seconds to the first answer, files in the inductor cache, the answer's tokens, the
    Python processes serving)."""
    inductor = workdir / "inductor"
    env = {
        **os.environ,
        **{key: value for key, value in CPU_VLLM_ENV.items() if key not in MODE_KEYS},
        **extra_env,
        "TORCHINDUCTOR_CACHE_DIR": str(inductor),
        "VLLM_CACHE_ROOT": str(workdir / "vllm-cache"),
    }
    port = free_ports(1)[0]
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    argv += ["--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16"]
    argv += ["--block-size", "32", "--enforce-eager", "--max-model-len", "2048", "--seed", "0"]
    argv += ["--kv-cache-memory-bytes", str(64 * 1024**2)]
    began = time.monotonic()
    with (workdir / "vllm.log").open("wb") as log:
        server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            while not healthy(port):
                if server.poll() is not None or time.monotonic() - began > START_TIMEOUT_S:
                    sys.exit(f"bench/vllm_start: the server did not start; see {workdir / 'vllm.log'}")
                time.sleep(0.5)
            ready = time.monotonic() - began
            processes = python_processes(server.pid)
            tokens = chat(port)
            answered = time.monotonic() - began
        finally:
            os.killpg(server.pid, 15)
            server.wait(timeout=120)
    files = sum(1 for p in inductor.rglob("*") if p.is_file()) if inductor.exists() else 0
    return ready, answered, files, tokens, processes


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    python = ROOT / os.environ.get("EPD_E2E_VENV", ".venv-e2e") / "bin" / "python"
    if not python.exists():
        sys.exit(f"bench/vllm_start runs the CPU vLLM: run `make setup-e2e` ({python} is missing)")
    built = subprocess.run([str(python), str(TINY_MODEL_SCRIPT), "--quiet"], capture_output=True, text=True, check=True)
    model = Path(built.stdout.strip().splitlines()[-1])
    print(f"bench/vllm_start: {len(os.sched_getaffinity(0))} cores, the tiny model, one server at a time")
    for round_ in range(args.rounds):
        answers = {}
        for mode, extra_env in MODES.items():
            with tempfile.TemporaryDirectory(prefix="epd-vllm-start-") as workdir:
                ready, answered, files, answers[mode], processes = start_and_ask(
                    python, model, Path(workdir), extra_env
                )
            print(
                f"  round {round_ + 1}, {mode}: /health after {ready:.1f} s, first answer after {answered:.1f} s, "
                f"{files} files in TorchInductor's cache, {processes} Python processes"
            )
        same = len({tuple(tokens) for tokens in answers.values()}) == 1
        print(f"  round {round_ + 1}: the same tokens in every mode: {same}")


if __name__ == "__main__":
    main()
