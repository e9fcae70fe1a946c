"""epd-proxy beside the routers a user would deploy instead (vllm-router, smg) and the direct call: latency
(p50/p99), throughput and CPU per request at concurrency 1, 16, 64 and 256, streamed and not, text-only
(pure routing cost) and P/D (prefill, then decode); then a burst of new clients arriving while each router is
saturated.

One stand-in backend (`backend.py`, one process serving every port) answers for every worker. The routers run
pinned to one core (`--router-core`), the backend and the load generator (wrk, one thread) to the other, so a
router's CPU per request is its own. Rounds are interleaved (every target once per round, so load from other
tenants hits all alike); a cell is the median over rounds. Goal (issue 17): ahead of both peers on CPU per
request and p99 at every level in PD-only and P/D modes, or within 1.3x of the best where a profile shows why
not. Image requests (E/P/D) go through epd-proxy only: see `peers.EPD_MODE_ABSENT`.

`--baseline REV` (repeatable) adds epd-proxy as it was at a git revision (its connectors/src, with this
environment's packages) as one more column, for before/after figures from one run. `--profile` adds a py-spy
profile of each epd-proxy at concurrency 64 (not streamed, PD-only) and prints the functions with the most self
time. The peers, wrk and py-spy are installed by the bench itself: the peers and py-spy into a cached
virtualenv outside the repository (`peers.VENV`), wrk from Debian's packages.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
from bench.proxy import load, peers  # noqa: E402 - the repository root is on the path only from here on

LEVELS = (1, 16, 64, 256)
OURS = "epd-proxy"
PEERS = ("vllm-router", "smg")
PLAIN, SPLIT = "PD-only", "P/D"


@dataclass
class Target:
    name: str
    url: str
    pid: int | None
    port: int


@dataclass
class Bench:
    workdir: Path
    router_core: int
    load_core: int
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, name: str, argv: list[str], health: str, core: int | None) -> subprocess.Popen[bytes]:
        pinned = ["taskset", "-c", str(core), *argv] if core is not None else argv
        log = self.workdir / f"{name.replace('/', '-')}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(pinned, stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir)
        self.processes.append(process)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited:\n{log.read_text(errors='replace')[-3000:]}")
            try:
                with urllib.request.urlopen(health, timeout=1) as answer:
                    if answer.status == 200:
                        return process
            except urllib.error.HTTPError as exc:
                exc.close()
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{name}: {health} did not answer 200:\n{log.read_text(errors='replace')[-3000:]}")

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_ours(
    bench: Bench, name: str, workers: dict[str, str], mode: str, source: Path | None, *, python: str = sys.executable
) -> Target:
    port = free_port()
    argv = [python, "-m", "epd_connectors.proxy.cli", "--host", "127.0.0.1", "--port", str(port)]
    if "plain" in workers:
        argv += ["--pd", workers["plain"]]
    else:
        argv += ["--prefill", workers["prefill"], "--decode", workers["decode"]]
    argv += ["--probe-interval", "5", "--log-level", "error"]
    if source is not None:  # the baseline's package first on the path
        argv = ["env", f"PYTHONPATH={source}", *argv]
    base = f"http://127.0.0.1:{port}"
    process = bench.start(f"{name}-{mode}", argv, base + "/health", bench.router_core)
    return Target(name, base + "/v1/chat/completions", process.pid, port)


def baseline_source(bench: Bench, revision: str) -> Path:
    """connectors/src of the proxy at a git revision, unpacked into the bench's folder."""
    folder = bench.workdir / f"baseline-{revision.replace('/', '-')}"
    folder.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(HERE.parent.parent), "archive", revision, "connectors/src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder / "connectors" / "src"


def start_routers(
    bench: Bench, workers: dict[str, str], mode: str, bin_dir: Path | None, args: argparse.Namespace
) -> list[Target]:
    targets = [start_ours(bench, OURS, workers, mode, None)]
    for revision, source in args.baseline_sources.items():
        targets.append(start_ours(bench, f"{OURS}@{revision}", workers, mode, source))
    for python in args.python:
        version = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        targets.append(start_ours(bench, f"{OURS}/py{version}", workers, mode, None, python=python))
    if bin_dir is None:
        return targets
    for name in ("vllm-router", "smg"):
        port, metrics = free_port(), free_port()
        if name == "vllm-router":
            argv = peers.vllm_router(bin_dir, port, metrics, workers)
        else:
            argv = peers.smg(bin_dir, port, metrics, workers, bench.workdir)
        base = f"http://127.0.0.1:{port}"
        process = bench.start(f"{name}-{mode}", argv, base + "/health", bench.router_core)
        targets.append(Target(name, base + "/v1/chat/completions", process.pid, port))
    return targets


def table(rows: list[tuple[str, bool, int, dict[str, load.Result]]], names: list[str]) -> str:
    """One line per cell: each target's p50/p99, rps and CPU per request, and ours against the best peer."""
    head = f"{'mode':<8}{'stream':>7}{'conc':>5}"
    for name in names:
        head += f" | {name + ' p50/p99 ms':>22} {'rps':>6} {'us/req':>6}"
    head += " | vs best peer: cpu  p99   rps"
    lines = [head, "-" * len(head)]
    for mode, stream, level, results in rows:
        line = f"{mode:<8}{'yes' if stream else 'no':>7}{level:>5}"
        for name in names:
            r = results.get(name)
            if r is None:
                line += f" | {'-':>22} {'-':>6} {'-':>6}"
                continue
            cell = f"{r.p50_ms:.2f}/{r.p99_ms:.2f}" + (f" ({r.errors}e)" if r.errors else "")
            line += f" | {cell:>22} {r.rps:>6.0f} {r.cpu_us:>6.0f}"
        others = [results[n] for n in names if n in PEERS and n in results]
        if others and OURS in results:
            ours = results[OURS]
            cpu = ours.cpu_us / min(o.cpu_us for o in others)
            p99 = ours.p99_ms / min(o.p99_ms for o in others)
            rps = ours.rps / max(o.rps for o in others)
            line += f" | {cpu:>17.2f}x {p99:.2f}x {rps:.2f}x"
        lines.append(line)
    return "\n".join(lines)


def combine(found: list[load.Result]) -> load.Result:
    return load.Result(
        statistics.median(r.p50_ms for r in found),
        statistics.median(r.p99_ms for r in found),
        statistics.median(r.rps for r in found),
        sum(r.errors for r in found),
        statistics.median(r.cpu_us for r in found),
    )


def profile(bench: Bench, target: Target, script: Path, seconds: float, bin_dir: Path) -> str:
    """py-spy's samples of the proxy under concurrency 64, as self time per function (top 15) and per file."""
    spy = bin_dir / "py-spy"
    if not spy.exists():
        installed = subprocess.run([str(bin_dir / "pip"), "install", "-q", "py-spy"], check=False, capture_output=True)
        if installed.returncode:
            return f"profile skipped: pip could not install py-spy: {installed.stderr.decode()[-300:]}"
    raw = bench.workdir / "profile.txt"
    record = subprocess.Popen(
        [
            str(spy),
            "record",
            "--format",
            "raw",
            "-o",
            str(raw),
            "-d",
            f"{seconds + 1:g}",
            "-r",
            "250",
            "-p",
            str(target.pid),
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    time.sleep(0.5)
    load.wrk(target.url, script, 64, seconds, bench.load_core).communicate()
    record.wait()
    by_function: collections.Counter[str] = collections.Counter()
    by_file: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frame = re.sub(r":\d+\)$", ")", stack.rsplit(";", 1)[-1])  # one line per function, not per line
        if not count.isdigit() or "(" not in frame:
            continue
        total += int(count)
        by_function[frame] += int(count)
        by_file[frame[frame.index("(") + 1 :].split(":")[0].rsplit("/", 1)[-1].rstrip(")")] += int(count)
    if not total:
        return "profile: no samples"
    lines = [f"py-spy, {total} samples of {target.name} at concurrency 64 (self time):"]
    lines += [f"  {100 * n / total:5.1f} %  {frame}" for frame, n in by_function.most_common(15)]
    lines.append("by file: " + ", ".join(f"{name} {100 * n / total:.1f} %" for name, n in by_file.most_common(10)))
    return "\n".join(lines)


def cells(bench: Bench, by_mode: dict[str, list[Target]], scripts: dict[bool, Path], args: argparse.Namespace) -> str:
    """Every (mode, streamed, level) cell, rounds interleaved over the targets; the table."""
    rows: list[tuple[str, bool, int, dict[str, load.Result]]] = []
    for mode, targets in by_mode.items():
        for stream in (False, True):
            for level in args.levels:
                found: dict[str, list[load.Result]] = {t.name: [] for t in targets}
                for _ in range(args.rounds):
                    for t in targets:
                        found[t.name].append(
                            load.measure(
                                t.url,
                                scripts[stream],
                                connections=level,
                                seconds=args.seconds,
                                core=bench.load_core,
                                pid=t.pid,
                            )
                        )
                rows.append((mode, stream, level, {name: combine(r) for name, r in found.items()}))
                print(f"  {mode} stream={stream} c={level}: done", file=sys.stderr, flush=True)
    names = list(dict.fromkeys(t.name for targets in by_mode.values() for t in targets))
    return table(rows, names)


def bursts(bench: Bench, targets: list[Target], script: Path, rounds: int) -> str:
    lines = [
        "burst: 256 new connections at once (one request each) while 64 wrk connections saturate the router",
        f"{'target':<12} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'failed':>7} {'peak listen queue':>18}",
    ]
    for t in targets:
        runs = [load.burst(t.url, t.port, script, clients=256, busy=64, core=bench.load_core) for _ in range(rounds)]
        line = f"{t.name:<12} {statistics.median(b.p50_ms for b in runs):>8.0f}"
        line += f" {statistics.median(b.p99_ms for b in runs):>8.0f}"
        line += f" {statistics.median(b.max_ms for b in runs):>8.0f} {sum(b.failed for b in runs):>7}"
        lines.append(line + f" {max(b.peak_queue for b in runs):>18}")
    return "\n".join(lines)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("EPD_BENCH_PROXY_SECONDS", "2")))
    parser.add_argument("--rounds", type=int, default=int(os.environ.get("EPD_BENCH_PROXY_ROUNDS", "3")))
    parser.add_argument(
        "--levels",
        type=lambda text: [int(level) for level in text.split(",")],
        default=list(LEVELS),
        help="concurrency levels, comma-separated",
    )
    parser.add_argument("--modes", type=lambda text: text.split(","), default=[PLAIN, SPLIT], help=f"{PLAIN},{SPLIT}")
    parser.add_argument("--router-core", type=int, default=0)
    parser.add_argument("--load-core", type=int, default=1)
    parser.add_argument("--no-peers", action="store_true", help="epd-proxy and the direct call only")
    parser.add_argument("--no-burst", action="store_true")
    parser.add_argument("--no-cells", action="store_true", help="only the burst (and the profile)")
    parser.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="REV",
        help="also run epd-proxy as it was at this git revision (repeat)",
    )
    parser.add_argument(
        "--python",
        action="append",
        default=[],
        metavar="PATH",
        help="also run epd-proxy with this interpreter (one with the connectors' proxy extra installed; repeat)",
    )
    parser.add_argument("--profile", action="store_true", help="py-spy profile of each epd-proxy at concurrency 64")
    return parser.parse_args()


def main() -> int:
    args = arguments()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the routers are stopped on the way out
    if shutil.which("wrk") is None:
        subprocess.run([str(HERE.parent.parent / "hack" / "setup-apt.sh"), "wrk"], check=True)
    bin_dir, where = (None, "skipped (--no-peers)") if args.no_peers else peers.install()
    print(f"peers {peers.VERSIONS}: {where}", flush=True)
    bench = Bench(Path(tempfile.mkdtemp(prefix="epd-bench-proxy-")), args.router_core, args.load_core)
    scripts = load.write_scripts(bench.workdir)
    try:
        ports = {role: free_port() for role in ("plain", "prefill", "decode")}
        argv = [sys.executable, str(HERE / "backend.py"), *map(str, ports.values())]
        plain_url = f"http://127.0.0.1:{ports['plain']}"
        bench.start("backend", argv, plain_url + "/health", args.load_core)
        args.baseline_sources = {revision: baseline_source(bench, revision) for revision in args.baseline}
        by_mode: dict[str, list[Target]] = {}
        if PLAIN in args.modes:
            direct = Target("direct", plain_url + "/v1/chat/completions", None, ports["plain"])
            by_mode[PLAIN] = [direct, *start_routers(bench, {"plain": plain_url}, "plain", bin_dir, args)]
        if SPLIT in args.modes:
            workers = {role: f"http://127.0.0.1:{ports[role]}" for role in ("prefill", "decode")}
            by_mode[SPLIT] = start_routers(bench, workers, "pd", bin_dir, args)
        shown = "" if args.no_cells else cells(bench, by_mode, scripts, args)
        if shown:
            print(
                f"\nproxy bench: {args.rounds} interleaved rounds of {args.seconds:g} s per cell (medians), routers "
                f"on core {args.router_core}, backend and wrk on core {args.load_core}, text-only chat, load average "
                f"{os.getloadavg()[0]:.1f} at the end; us/req: the router's CPU per request; vs best peer: ours / "
                "the better peer's (below 1x: ahead on cpu and p99; above 1x: ahead on rps)"
            )
            print(shown)
        print(f"E/P/D: {peers.EPD_MODE_ABSENT}")
        if not args.no_burst and PLAIN in by_mode:
            print("\n" + bursts(bench, by_mode[PLAIN], scripts[False], args.rounds))
        if args.profile and PLAIN in by_mode:
            for ours in (t for t in by_mode[PLAIN] if t.name.startswith(OURS)):
                spy = bin_dir or peers.VENV / "bin"
                print("\n" + profile(bench, ours, scripts[False], max(args.seconds, 5.0), spy))
    finally:
        bench.stop()
        shutil.rmtree(bench.workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
