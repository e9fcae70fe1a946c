"""Load and what it costs: wrk runs (latency percentiles, throughput), CPU seconds of a process tree, the burst
of new clients, and the listen queue while it waits.

wrk is a C load generator (Debian's package): one thread on the load core drives every level. It is not the
limit: the direct call to the stand-in backend, measured by the same wrk on the same core, is printed beside
every router and runs at several times their throughput.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
BODY = {"model": "bench", "messages": [{"role": "user", "content": "Say ok four times."}], "max_tokens": 4}
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


@dataclass
class Result:
    p50_ms: float
    p99_ms: float
    rps: float
    errors: int
    cpu_us: float
    """CPU time (user + system) of the router's processes per request: its cost, whatever else runs."""


def tree_cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a process and its descendants so far (/proc/PID/stat 14 and 15)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    wanted = {pid}
    grew = True
    while grew:
        more = {child for child, parent in parents.items() if parent in wanted} - wanted
        grew = bool(more)
        wanted |= more
    return sum(times.get(p, 0.0) for p in wanted)


def write_scripts(workdir: Path) -> dict[bool, Path]:
    """wrk Lua scripts that POST the chat body, not streamed and streamed."""
    scripts = {}
    for stream in (False, True):
        body = json.dumps({**BODY, "stream": stream})
        path = workdir / f"post-{'stream' if stream else 'plain'}.lua"
        path.write_text(
            f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = {json.dumps(body)}\n'
        )
        scripts[stream] = path
    return scripts


def _millis(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text.strip())
    if match is None:
        raise ValueError(f"not a wrk duration: {text!r}")
    return float(match[1]) * _UNITS[match[2]]


def parse_wrk(output: str) -> tuple[float, float, float, int]:
    """p50 ms, p99 ms, requests per second and errors (socket errors plus non-2xx answers) from `wrk --latency`."""
    p50 = _millis(re.search(r"^\s+50%\s+(\S+)", output, re.M)[1])  # type: ignore[index]
    p99 = _millis(re.search(r"^\s+99%\s+(\S+)", output, re.M)[1])  # type: ignore[index]
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output)[1])  # type: ignore[index]
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", output))
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    return p50, p99, rps, errors + (int(non_2xx[1]) if non_2xx else 0)


def wrk(url: str, script: Path, connections: int, seconds: float, core: int) -> subprocess.Popen[str]:
    argv = ["taskset", "-c", str(core), "wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency"]
    argv += ["--timeout", "10s", "-s", str(script), url]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def measure(url: str, script: Path, *, connections: int, seconds: float, core: int, pid: int | None) -> Result:
    """One wrk run after a short warm-up (which opens the router's backend connections)."""
    wrk(url, script, connections, 0.3, core).communicate()
    cpu_before = tree_cpu_seconds(pid) if pid else 0.0
    output, _ = wrk(url, script, connections, seconds, core).communicate()
    cpu = tree_cpu_seconds(pid) - cpu_before if pid else float("nan")
    p50, p99, rps, errors = parse_wrk(output)
    requests = max(1.0, rps * seconds)
    return Result(p50, p99, rps, errors, cpu * 1e6 / requests)


BURST_CLIENT = r"""
import asyncio, json, sys, time
port, count = int(sys.argv[1]), int(sys.argv[2])
body = sys.argv[3].encode()
request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
           b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))

async def answer(started):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    length = [int(line.split(b":")[1]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length")]
    await (reader.readexactly(length[0]) if length else reader.read())
    writer.close()
    return time.perf_counter() - started, head.startswith(b"HTTP/1.1 200")

async def one(started):
    return await asyncio.wait_for(answer(started), 30)

async def main():
    started = time.perf_counter()
    done = await asyncio.gather(*(one(started) for _ in range(count)), return_exceptions=True)
    ok = sorted(d[0] for d in done if not isinstance(d, BaseException) and d[1])
    print(json.dumps({"seconds": ok, "failed": count - len(ok)}))

asyncio.run(main())
"""


@dataclass
class Burst:
    p50_ms: float
    p99_ms: float
    max_ms: float
    failed: int
    peak_queue: int
    """Most connections seen waiting in the router's listen queue (ss Recv-Q) during the burst."""


def _queued(port: int) -> int:
    shown = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], check=False, capture_output=True, text=True)
    fields = shown.stdout.split()
    return int(fields[1]) if len(fields) > 1 else 0


def burst(url: str, port: int, script: Path, *, clients: int, busy: int, core: int) -> Burst:
    """`clients` new connections at once, one request each, while `busy` wrk connections keep the router
    saturated; the time from the burst's start to each answer's end."""
    load = wrk(url, script, busy, 4, core)
    time.sleep(1.0)
    body = json.dumps({**BODY, "stream": False})
    client = subprocess.Popen(
        ["taskset", "-c", str(core), sys.executable, "-c", BURST_CLIENT, str(port), str(clients), body],
        stdout=subprocess.PIPE,
        text=True,
    )
    peak = 0
    while client.poll() is None:
        peak = max(peak, _queued(port))
        time.sleep(0.02)
    output, _ = client.communicate()
    load.communicate()
    found = json.loads(output)
    seconds = found["seconds"] or [float("nan")]
    return Burst(
        seconds[len(seconds) // 2] * 1e3,
        seconds[min(len(seconds) - 1, int(len(seconds) * 0.99))] * 1e3,
        seconds[-1] * 1e3,
        found["failed"],
        peak,
    )
