"""The routers a user would deploy instead of epd-proxy, installed in a cached virtualenv outside the repository.

vllm-router (vLLM's Rust router: plain and P/D with --vllm-pd-disaggregation) and smg (a Rust model gateway:
plain and P/D). Each is started with what a lean deployment would set: one worker list, round-robin, health
checks rare, logging at warnings. smg's P/D takes the vLLM (NIXL-style, sequential) path only when its workers
are found through a discovery file that names their connector, so it gets one; with plain --prefill/--decode it
would send both legs at once, SGLang style. Neither has an E/P/D mode that drives vLLM's HTTP encoders:
smg's --epd-disaggregation needs gRPC workers of its own runtime, and vllm-router's CLI has no E/P/D mode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

VERSIONS = {"vllm-router": "0.1.17", "smg": "1.13.0"}
VENV = Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / "epd-operator" / "bench-peers"
EPD_MODE_ABSENT = (
    "image requests go through epd-proxy only: smg's --epd-disaggregation takes gRPC encoders of its own runtime "
    "(its HTTP mode refuses EPD), and vllm-router's command line has no E/P/D mode"
)


def install() -> tuple[Path | None, str]:
    """The peers' bin folder, installed once (pinned); or None and why not."""
    stamp = VENV / f".ok-{'-'.join(f'{k}{v}' for k, v in sorted(VERSIONS.items()))}"
    if stamp.exists():
        return VENV / "bin", f"from {VENV}"
    if not (VENV / "bin" / "python").exists():
        made = subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=False, capture_output=True)
        if made.returncode:
            return None, f"no virtualenv at {VENV}: {made.stderr.decode()[-300:]}"
    pins = [f"{name}=={version}" for name, version in VERSIONS.items()]
    done = subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", *pins], check=False, capture_output=True)
    if done.returncode:
        return None, f"pip could not install {pins}: {done.stderr.decode()[-500:]}"
    stamp.touch()
    return VENV / "bin", f"installed into {VENV}"


def vllm_router(bin_dir: Path, port: int, metrics_port: int, workers: dict[str, str]) -> list[str]:
    """`workers`: {"plain": URL} or {"prefill": URL, "decode": URL}."""
    argv = [str(bin_dir / "vllm-router"), "--host", "127.0.0.1", "--port", str(port)]
    if "plain" in workers:
        argv += ["--worker-urls", workers["plain"]]
    else:
        argv += ["--vllm-pd-disaggregation", "--prefill", workers["prefill"], "--decode", workers["decode"]]
    # --log-level warning is read as info by its Rust side; error is honoured. Its metrics listener cannot be
    # turned off, so it gets a port of ours.
    return [
        *argv,
        "--policy",
        "round_robin",
        "--log-level",
        "error",
        "--health-check-interval-secs",
        "3600",
        "--worker-startup-check-interval",
        "1",
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(metrics_port),
    ]


def smg(bin_dir: Path, port: int, metrics_port: int, workers: dict[str, str], workdir: Path) -> list[str]:
    argv = [str(bin_dir / "smg"), "launch", "--host", "127.0.0.1", "--port", str(port)]
    if "plain" in workers:
        argv += ["--worker-urls", workers["plain"]]
    else:
        listing = workdir / "smg-workers.json"
        listing.write_text(
            json.dumps(
                {
                    "version": 1,
                    "workers": [
                        {"id": f"{role}-0", "url": workers[role], "worker_type": role, "kv_connector": "NixlConnector"}
                        for role in ("prefill", "decode")
                    ],
                }
            )
        )
        argv += [
            "--pd-disaggregation",
            "--discovery-provider",
            "file",
            "--discovery-file",
            str(listing),
            "--discovery-check-interval-secs",
            "3600",
        ]
    # Load reports and overload protection poll workers the stand-in cannot answer meaningfully.
    return [
        *argv,
        "--policy",
        "round_robin",
        "--log-level",
        "warn",
        "--health-check-interval-secs",
        "3600",
        "--disable-load-monitoring",
        "--disable-worker-overload-protection",
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(metrics_port),
    ]
