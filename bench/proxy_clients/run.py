"""epd-proxy's memory and connections under hostile clients (issue 36), optionally beside the proxy as it was at
git revisions (`--baseline REV`, as bench/proxy does), in one run on one machine.

Each proxy is a PD-only epd-proxy in front of the proxy bench's stand-in backend. The same clients in order:
three chunked bodies larger than the body limit (256 MiB), cut off by the proxy's 413; five valid 20 MB image
requests, each on its own connection, closed after the answer; then 200 connections that send half a request
head and wait. Printed: the proxy's resident memory (VmRSS) at start and after each of the first two, and how
many of the 200 are still open 12 s later (the head limit is 10 s). A body only a reference cycle holds stays
until the cycle collector runs, which the proxy's raised collector threshold puts off for thousands of
connections: it shows as memory that does not come back.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
from bench.proxy.run import Bench, baseline_source, free_port, start_ours  # noqa: E402 - root on the path first

OVERSIZED_BYTES = 300 * 1024 * 1024
IMAGE_BYTES = 20 * 1000 * 1000
HALF_HEADS = 200
HEAD_WAIT_S = 12.0


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def settled_rss(pid: int) -> float:
    time.sleep(1.0)
    return rss_mib(pid)


def send_oversized(port: int) -> None:
    """A chunked body past the limit, 1 MiB a chunk, until the proxy answers and closes."""
    piece = b"x" * (1024 * 1024)
    chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: b\r\ntransfer-encoding: chunked\r\n\r\n")
        with contextlib.suppress(OSError):  # refused (413) and closed while we still sent
            for _ in range(OVERSIZED_BYTES // len(piece)):
                conn.sendall(chunk)
        conn.settimeout(5)
        with contextlib.suppress(OSError):
            conn.recv(4096)


def send_image(port: int) -> int:
    image = "data:image/png;base64," + base64.b64encode(b"\x89PNG" + b"\0" * (IMAGE_BYTES * 3 // 4)).decode()
    content = [{"type": "text", "text": "what"}, {"type": "image_url", "image_url": {"url": image}}]
    body = json.dumps({"model": "bench", "max_tokens": 4, "messages": [{"role": "user", "content": content}]})
    raw = body.encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: b\r\ncontent-type: application/json\r\n"
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(head + b"content-length: %d\r\nconnection: close\r\n\r\n" % len(raw) + raw)
        conn.settimeout(30)
        answer = conn.recv(65536)
    return int(answer.split()[1]) if answer else 0


def still_open_after_half_heads(port: int) -> int:
    conns = []
    for _ in range(HALF_HEADS):
        conn = socket.create_connection(("127.0.0.1", port))
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: b\r\n")
        conns.append(conn)
    time.sleep(HEAD_WAIT_S)
    open_ = 0
    for conn in conns:
        conn.setblocking(False)
        try:
            data = conn.recv(4096)
            open_ += 0 if data == b"" or data.startswith(b"HTTP/1.1 408") else 1
        except BlockingIOError:
            open_ += 1  # nothing to read, not closed
        except OSError:
            pass
        conn.close()
    return open_


def measure(bench: Bench, name: str, backend: str, source: Path | None) -> list[str]:
    target = start_ours(bench, name, {"plain": backend}, "plain", source)
    assert target.pid is not None
    start = settled_rss(target.pid)
    for _ in range(3):
        send_oversized(target.port)
    oversized = settled_rss(target.pid)
    statuses = [send_image(target.port) for _ in range(5)]
    images = settled_rss(target.pid)
    left_open = still_open_after_half_heads(target.port)
    return [
        name,
        f"{start:.0f}",
        f"{oversized:.0f}",
        f"{images:.0f}",
        "/".join(sorted({str(s) for s in statuses})),
        f"{left_open}/{HALF_HEADS}",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", action="append", default=[], metavar="REV", help="also run the proxy at REV")
    args = parser.parse_args()
    bench = Bench(Path(tempfile.mkdtemp(prefix="epd-bench-clients-")), router_core=0, load_core=1)
    try:
        port = free_port()
        backend = f"http://127.0.0.1:{port}"
        bench.start(
            "backend", [sys.executable, str(HERE.parent / "proxy" / "backend.py"), str(port)], backend + "/health", 1
        )
        rows = [measure(bench, "epd-proxy", backend, None)]
        for revision in args.baseline:
            rows.append(measure(bench, f"epd-proxy@{revision}", backend, baseline_source(bench, revision)))
    finally:
        bench.stop()
        shutil.rmtree(bench.workdir, ignore_errors=True)
    header = [
        "proxy",
        "RSS start MiB",
        "after 3 oversized",
        "after 5 x 20 MB images",
        "image answers",
        "half heads open",
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print(f"\nproxy under hostile clients ({time.strftime('%Y-%m-%d')}):")
    for row in [header, *rows]:
        print("  " + "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
