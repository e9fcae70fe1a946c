"""Start `epd-proxy` as a process on loopback in front of given instances: the seam for tests against real vLLM.

The end-to-end tests start real encoder and PD (or prefill and decode) servers, then need the proxy in front of
them exactly as a pod runs it: the real command, its own process, its own port. Usage:

    with local_proxy(encoders=["http://127.0.0.1:8001"], pd=["http://127.0.0.1:8002"]) as proxy:
        httpx.post(proxy.url + "/v1/chat/completions", json=...)

The context waits until the proxy's /health is 200 (every role has a healthy instance) and stops the process on
exit; `proxy.log_path` holds its output for a failing test to print.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

DEFAULT_READY_TIMEOUT_S = 180.0
"""Seconds to wait for /health: real vLLM on a CPU takes about a minute to start per instance."""


@dataclass(frozen=True)
class LocalProxy:
    """A running proxy process."""

    url: str
    """http://127.0.0.1:PORT"""
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def proxy_argv(
    *,
    port: int,
    encoders: Sequence[str] = (),
    pd: Sequence[str] = (),
    prefill: Sequence[str] = (),
    decode: Sequence[str] = (),
    ec_consumers: Sequence[str] = (),
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The command line: the installed `epd-proxy` entry point, run with this Python."""
    argv = [sys.executable, "-m", "epd_connectors.proxy.cli", "--host", "127.0.0.1", "--port", str(port)]
    for flag, urls in (("--encoder", encoders), ("--pd", pd), ("--prefill", prefill), ("--decode", decode)):
        for url in urls:
            argv += [flag, url]
    for address in ec_consumers:
        argv += ["--ec-consumer", address]
    return argv + list(extra_args)


@contextmanager
def local_proxy(
    *,
    encoders: Sequence[str] = (),
    pd: Sequence[str] = (),
    prefill: Sequence[str] = (),
    decode: Sequence[str] = (),
    ec_consumers: Sequence[str] = (),
    extra_args: Sequence[str] = (),
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    wait_healthy: bool = True,
    log_dir: Path | None = None,
) -> Iterator[LocalProxy]:
    """Run the proxy until the block ends. `wait_healthy=False` returns once it answers at all (a test that
    expects a role to be down); `extra_args` are further `epd-proxy` flags (e.g. `--kv-protocol mooncake`)."""
    port = _free_port()
    argv = proxy_argv(
        port=port,
        encoders=encoders,
        pd=pd,
        prefill=prefill,
        decode=decode,
        ec_consumers=ec_consumers,
        extra_args=extra_args,
    )
    folder = log_dir or Path(tempfile.mkdtemp(prefix="epd-proxy-"))
    log_path = folder / f"epd-proxy-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    proxy = LocalProxy(f"http://127.0.0.1:{port}", process, log_path)
    try:
        _wait_ready(proxy, ready_timeout_s, wait_healthy)
        yield proxy
    finally:
        _stop(process)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(proxy: LocalProxy, timeout_s: float, healthy: bool) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proxy.process.poll() is not None:
            raise RuntimeError(f"epd-proxy exited with {proxy.process.returncode}:\n{proxy.log()}")
        try:
            with urllib.request.urlopen(proxy.url + "/health", timeout=2) as response:
                if response.status == 200:
                    return
        except urllib.error.HTTPError as exc:
            if not healthy:
                return
            exc.close()
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"epd-proxy at {proxy.url} not healthy after {timeout_s} s:\n{proxy.log()}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
