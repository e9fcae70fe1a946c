"""What the proxy adds: latency (p50/p99) and maximum throughput against a direct call to a fast local backend,
at concurrency 1, 16 and 64, streamed and not, next to vLLM's example proxy under the same load.

Goals: added p50 under 1 ms; throughput at least 2x the example proxy's. The backend is `backend.py` (raw
asyncio, so the proxies are the bottleneck); the load is text-only chat requests, which both proxies forward
straight to the decode side. vLLM's example proxy (examples/disaggregated/disaggregated_encoder/
disagg_epd_proxy.py) is never part of this repository: give its path with --example-proxy (or
EPD_EXAMPLE_PROXY), or have a git mirror of vllm-project/vllm under /work/.mirror; it is copied into a temporary
folder outside the repository and run from there, with its own dependencies (fastapi, msgspec) installed into a
cache folder outside the repository. Without it that column is skipped with a message.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import uvloop

from epd_connectors.proxy import http1

HERE = Path(__file__).resolve().parent
EXAMPLE_PATH = "examples/disaggregated/disaggregated_encoder/disagg_epd_proxy.py"
EXAMPLE_DEPS = ["fastapi", "msgspec"]
DEPS_CACHE = Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / "epd-operator" / "bench-proxy-deps"
LEVELS = (1, 16, 64)
BODY = {"model": "bench", "messages": [{"role": "user", "content": "Say ok four times."}], "max_tokens": 4}


@dataclass
class Result:
    p50_ms: float
    p99_ms: float
    rps: float
    errors: int
    cpu_us: float = float("nan")
    """CPU time (user + system) the proxy process spent per request: its cost, whatever else runs."""


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a process so far (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, timeout_s: float, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError as exc:
            exc.close()
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer:\n{log.read_text(errors='replace')[-3000:]}")


def _start(
    argv: list[str], url: str, workdir: Path, name: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    log = workdir / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, cwd=workdir, env={**os.environ, **(env or {})}
        )
    try:
        _wait_http(url, 60, process, log)
    except BaseException:
        _stop(process)
        raise
    return process


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _example_source(given: str | None) -> tuple[str | None, str]:
    """The example proxy's text, or None and why not."""
    if given:
        path = Path(given)
        return (path.read_text(), str(path)) if path.is_file() else (None, f"{given} is not a file")
    for git_dir in sorted(glob.glob("/work/.mirror/*vllm*")):
        shown = subprocess.run(
            ["git", "--git-dir", git_dir, "show", f"HEAD:{EXAMPLE_PATH}"], check=False, capture_output=True
        )
        if shown.returncode == 0:
            return shown.stdout.decode(), f"{git_dir}:{EXAMPLE_PATH}"
    return None, "no --example-proxy / EPD_EXAMPLE_PROXY given and no vLLM mirror under /work/.mirror"


def _example_deps() -> tuple[str | None, str]:
    """A folder holding the example's own dependencies (outside the repository), installed once."""
    missing = [
        m
        for m in EXAMPLE_DEPS
        if subprocess.run([sys.executable, "-c", f"import {m}"], check=False, capture_output=True).returncode
    ]
    if not missing:
        return "", "from this environment"
    stamp = DEPS_CACHE / ".ok"
    if not stamp.exists():
        DEPS_CACHE.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--target", str(DEPS_CACHE), *EXAMPLE_DEPS],
            check=False,
            capture_output=True,
        )
        if done.returncode:
            return None, f"pip could not install {EXAMPLE_DEPS}: {done.stderr.decode()[-500:]}"
        stamp.touch()
    return str(DEPS_CACHE), f"from {DEPS_CACHE}"


async def _measure(url: str, stream: bool, concurrency: int, seconds: float, pid: int | None) -> Result:
    """`concurrency` clients in a loop for `seconds` (after a short warm-up); the proxy's pooled HTTP/1.1 client
    drives the load, as it costs about half of aiohttp's CPU per request and the load shares the machine."""
    payload = json.dumps({**BODY, "stream": stream}).encode()
    headers = {"content-type": "application/json"}
    latencies: list[float] = []
    errors = 0
    pool = http1.Pool(connect_timeout=5, keepalive_s=60)

    async def worker(deadline: float) -> None:
        nonlocal errors
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            try:
                response = await pool.request("POST", url, payload, headers)
                await response.read()
                response.release()
                if response.status != 200:
                    errors += 1
            except OSError:
                errors += 1
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(worker(time.perf_counter() + min(0.5, seconds / 4)) for _ in range(concurrency)))
    latencies.clear()
    errors = 0
    cpu_before = _cpu_seconds(pid) if pid else 0.0
    started = time.perf_counter()
    await asyncio.gather(*(worker(started + seconds) for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    cpu = (_cpu_seconds(pid) - cpu_before) if pid else float("nan")
    await pool.close()
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else float("nan")
    p50 = statistics.median(ordered) * 1e3 if ordered else float("nan")
    return Result(p50, p99 * 1e3, len(ordered) / elapsed, errors, cpu * 1e6 / max(1, len(ordered)))


def _combine(rounds: list[Result]) -> Result:
    """Median latencies over rounds, best throughput: the machine may be shared, and other tenants' bursts
    only ever make a round slower."""
    return Result(
        statistics.median(r.p50_ms for r in rounds),
        statistics.median(r.p99_ms for r in rounds),
        max(r.rps for r in rounds),
        sum(r.errors for r in rounds),
        statistics.median(r.cpu_us for r in rounds),
    )


def _table(rows: list[tuple[str, int, dict[str, Result]]], names: list[str]) -> str:
    head = f"{'mode':<10}{'conc':>5} | {'direct p50/p99 ms':>18} {'rps':>6}"
    for name in names[1:]:
        head += f" | {name + ' +p50/+p99 ms':>26} {'rps':>6} {'cpu us/req':>10}"
    if "example" in names:
        head += f" | {'rps ratio':>9} {'cpu ratio':>9}"
    lines = [head, "-" * len(head)]
    for mode, level, results in rows:
        direct = results["direct"]
        line = f"{mode:<10}{level:>5} | {direct.p50_ms:>8.3f}/{direct.p99_ms:<9.3f} {direct.rps:>6.0f}"
        for name in names[1:]:
            r = results[name]
            added = f"{r.p50_ms - direct.p50_ms:+.3f}/{r.p99_ms - direct.p99_ms:+.3f}"
            line += f" | {added:>26} {r.rps:>6.0f} {r.cpu_us:>10.0f}"
            if r.errors:
                line += f" ({r.errors} err)"
        if "example" in names:
            ours, theirs = results["epd-proxy"], results["example"]
            line += f" | {ours.rps / theirs.rps:>8.2f}x {theirs.cpu_us / ours.cpu_us:>8.2f}x"
        lines.append(line)
    return "\n".join(lines)


def _start_example(given: str | None, backend: str, processes: list[subprocess.Popen[bytes]]) -> str | None:
    """Run vLLM's example proxy from a temporary folder outside the repository; its URL, or None (told why)."""
    source, where = _example_source(given)
    deps, deps_where = _example_deps() if source is not None else (None, "")
    if source is None or deps is None:
        print(f"example proxy column skipped: {where if source is None else deps_where}")
        return None
    example_dir = Path(tempfile.mkdtemp(prefix="vllm-example-proxy-"))
    script = example_dir / "disagg_epd_proxy.py"
    script.write_text(source)
    port = _free_port()
    argv = [sys.executable, str(script), "--host", "127.0.0.1", "--port", str(port), "--encode-servers-urls", backend]
    argv += ["--prefill-servers-urls", "disable", "--decode-servers-urls", backend]
    env = {"PYTHONPATH": deps} if deps else {}
    processes.append(_start(argv, f"http://127.0.0.1:{port}/health", example_dir, "example", env))
    print(f"example proxy: {where}, run from {example_dir}, dependencies {deps_where}")
    return f"http://127.0.0.1:{port}/v1/chat/completions"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("EPD_BENCH_PROXY_SECONDS", "1.5")))
    parser.add_argument("--rounds", type=int, default=int(os.environ.get("EPD_BENCH_PROXY_ROUNDS", "3")))
    parser.add_argument("--example-proxy", default=os.environ.get("EPD_EXAMPLE_PROXY"))
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="epd-bench-proxy-"))
    processes: list[subprocess.Popen[bytes]] = []
    try:
        backend_port = _free_port()
        backend = f"http://127.0.0.1:{backend_port}"
        processes.append(
            _start(
                [sys.executable, str(HERE / "backend.py"), str(backend_port)], backend + "/health", workdir, "backend"
            )
        )
        targets = {"direct": backend + "/v1/chat/completions"}
        ours = _free_port()
        processes.append(
            _start(
                [
                    sys.executable,
                    "-m",
                    "epd_connectors.proxy.cli",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(ours),
                    "--encoder",
                    backend,
                    "--pd",
                    backend,
                    "--probe-interval",
                    "5",
                    "--log-level",
                    "error",
                ],
                f"http://127.0.0.1:{ours}/health",
                workdir,
                "epd-proxy",
            )
        )
        targets["epd-proxy"] = f"http://127.0.0.1:{ours}/v1/chat/completions"
        pids: dict[str, int] = {"epd-proxy": processes[-1].pid}
        example = _start_example(args.example_proxy, backend, processes)
        if example is not None:
            targets["example"] = example
            pids["example"] = processes[-1].pid
        rows: list[tuple[str, int, dict[str, Result]]] = []
        for stream in (False, True):
            for level in LEVELS:
                rounds: dict[str, list[Result]] = {name: [] for name in targets}
                for _ in range(args.rounds):  # interleaved, so load from other tenants hits every target alike
                    for name, url in targets.items():
                        result = uvloop.run(_measure(url, stream, level, args.seconds, pids.get(name)))
                        rounds[name].append(result)
                results = {name: _combine(found) for name, found in rounds.items()}
                rows.append(("stream" if stream else "no-stream", level, results))
        print(
            f"\nproxy bench: {args.rounds} interleaved rounds of {args.seconds:g} s per cell (latency: median of "
            f"rounds, rps: best round), {os.cpu_count()} CPUs, text-only chat, "
            f"load average {os.getloadavg()[0]:.1f} at the end"
        )
        print(_table(rows, list(targets)))
        worst_added = max(r[2]["epd-proxy"].p50_ms - r[2]["direct"].p50_ms for r in rows if r[1] == 1)
        print(
            f"\ngoal added p50 < 1 ms at concurrency 1: {worst_added:.3f} ms -> "
            f"{'met' if worst_added < 1 else 'NOT met'}"
        )
        if "example" in targets:
            best_ours = max(r[2]["epd-proxy"].rps for r in rows)
            best_example = max(r[2]["example"].rps for r in rows)
            ratio = best_ours / best_example
            capacity = min(r[2]["example"].cpu_us / r[2]["epd-proxy"].cpu_us for r in rows)
            print(f"capacity (requests per CPU-second of the proxy process, worst cell): {capacity:.2f}x the example's")
            print(
                f"goal max throughput >= 2x example: {best_ours:.0f} vs {best_example:.0f} rps = {ratio:.2f}x -> "
                f"{'met' if ratio >= 2 else 'NOT met'}"
            )
    finally:
        for process in reversed(processes):
            _stop(process)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
