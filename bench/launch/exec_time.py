"""How long epd-launch takes from its start to the exec of the real process, with the dependency already up.

Goal: under 0.3 s. We start a real mooncake_master first (so the store owner's wait is one successful probe),
then start `epd-launch store-client` many times and watch /proc/PID/comm: the moment it reads
"mooncake_client", the launcher has replaced itself. Each exec'd client is killed right away.
"""

from __future__ import annotations

import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from epd_connectors import store_probe
from epd_connectors.config.bundle import RoleBundle

RUNS = 20
BIN_DIR = Path(sys.executable).parent
LOOPBACK = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _time_to_exec(role: str, bundle_path: Path, workdir: Path, comm: str) -> float:
    env = {**os.environ, "PATH": f"{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"}
    start = time.perf_counter()
    proc = subprocess.Popen(
        [str(BIN_DIR / "epd-launch"), role, "--bundle", str(bundle_path), "--workdir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        while True:
            try:
                current = Path(f"/proc/{proc.pid}/comm").read_text().strip()
            except FileNotFoundError:
                current = ""
            if current == comm[:15]:
                return time.perf_counter() - start
            if proc.poll() is not None:
                raise RuntimeError(f"epd-launch {role} exited with {proc.returncode} before exec")
            time.sleep(0.0005)
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="epd-bench-launch-") as tmp:
        workdir = Path(tmp)
        rpc, metrics = _free_port(), _free_port()
        master_bundle = RoleBundle.model_validate(
            {
                "deployment": "bench",
                "role": "master",
                "master": {"rpc_address": LOOPBACK, "rpc_port": rpc, "metrics_port": metrics},
            }
        )
        master_path = workdir / "master.json"
        master_path.write_text(master_bundle.to_json())
        # The master's own launch is measured too (it has no dependency).
        master_times = []
        for _ in range(3):
            master_times.append(_time_to_exec("master", master_path, workdir, "mooncake_master"))
        master = subprocess.Popen(
            [
                str(BIN_DIR / "mooncake_master"),
                f"--rpc_address={LOOPBACK}",
                f"--rpc_port={rpc}",
                f"--metrics_port={metrics}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            health = f"http://{LOOPBACK}:{metrics}/health"
            store_probe.wait_for_master(health, timeout_s=20)
            client_bundle = RoleBundle.model_validate(
                {
                    "deployment": "bench",
                    "role": "store-client",
                    "store_client": {
                        "host": LOOPBACK,
                        "port": _free_port(),
                        "global_segment_size": "64 MiB",
                        "master_server_address": f"{LOOPBACK}:{rpc}",
                        "protocol": "tcp",
                    },
                    "peers": {"master_health_url": health},
                }
            )
            client_path = workdir / "client.json"
            client_path.write_text(client_bundle.to_json())
            times = [_time_to_exec("store-client", client_path, workdir, "mooncake_client") for _ in range(RUNS)]
        finally:
            master.kill()
            master.wait()
    print(f"epd-launch start -> exec ({platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()})")
    print(f"{'role':<14} {'runs':>4} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}  goal < 300 ms")
    _row("store-client", times)
    _row("master", master_times)


def _row(role: str, samples: list[float]) -> None:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    p50 = statistics.median(ordered)
    print(f"{role:<14} {len(ordered):>4} {p50 * 1e3:>8.1f} {p95 * 1e3:>8.1f} {ordered[-1] * 1e3:>8.1f}")


if __name__ == "__main__":
    main()
