"""Put/get throughput of a real Mooncake store set up only from our generated configs: embedded vs standalone.

Why: the store mode is a deployment choice (design.md, `spec.store.mode`). Embedded keeps values in the vLLM
process's own segment; standalone-store sends them to a separate mooncake_client that owns the pool. This
measures what that hop costs for encoder-output-sized (64 KiB, 1 MiB) and KV-block-batch-sized (16 MiB) values,
on loopback over TCP, with the master and the owner started from `MasterConfig.argv()` and
`StoreClientConfig.argv()` and the requester from the rendered vLLM JSON (`store_probe.open_store`).

Run: .venv/bin/python bench/launch/store_throughput.py [--total-mib 128]
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epd_connectors import store_probe
from epd_connectors.config.master import MasterConfig
from epd_connectors.config.mooncake import MooncakeStoreConfig
from epd_connectors.config.sizes import format_size
from epd_connectors.config.store_client import StoreClientConfig

BIN_DIR = Path(sys.executable).parent
LOOPBACK = "127.0.0.1"
KiB, MiB = 1024, 1024**2
VALUE_SIZES = (64 * KiB, MiB, 16 * MiB)
POOL = 512 * MiB
"""Pool per mode: room for one size's values (default 128 MiB) with eviction never in play."""
LOCAL_BUFFER = 64 * MiB
"""Requester staging buffer: must hold the largest single value (16 MiB) with room to spare."""


@dataclass(frozen=True)
class Row:
    mode: str
    value_size: int
    count: int
    put_s: float
    get_s: float
    batch_get_s: float

    def cells(self) -> list[str]:
        total = self.value_size * self.count
        return [
            self.mode,
            format_size(self.value_size),
            str(self.count),
            f"{total / self.put_s / 1e9:.2f}",
            f"{total / self.get_s / 1e9:.2f}",
            f"{total / self.batch_get_s / 1e9:.2f}",
            f"{self.count / self.put_s:,.0f}",
            f"{self.count / self.get_s:,.0f}",
        ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


@contextmanager
def _process(argv: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(BIN_DIR / argv[0]), *argv[1:]], stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _measure(store: Any, mode: str, value_size: int, total: int) -> Row:
    count = max(1, total // value_size)
    value = os.urandom(value_size)
    keys = [f"bench/{mode}/{value_size}/{i}" for i in range(count)]
    start = time.perf_counter()
    for key in keys:
        code = store.put(key, value)
        if code != 0:
            raise store_probe.StoreError(f"put {key}", int(code))
    put_s = time.perf_counter() - start
    start = time.perf_counter()
    for key in keys:
        if len(store.get(key)) != value_size:
            raise store_probe.StoreError(f"get {key}", store_probe.OBJECT_NOT_FOUND)
    get_s = time.perf_counter() - start
    # Batches as vLLM's connectors issue them, each within half the requester's staging buffer.
    per_batch = max(1, LOCAL_BUFFER // 2 // value_size)
    start = time.perf_counter()
    for first in range(0, count, per_batch):
        batch = keys[first : first + per_batch]
        if [len(v) for v in store.get_batch(batch)] != [value_size] * len(batch):
            raise store_probe.StoreError(f"get_batch {batch[0]}..", store_probe.OBJECT_NOT_FOUND)
    batch_get_s = time.perf_counter() - start
    for key in keys:
        store.remove(key)
    return Row(mode, value_size, count, put_s, get_s, batch_get_s)


def run(total: int, workdir: Path) -> list[Row]:
    master = MasterConfig(rpc_address=LOOPBACK, rpc_port=_free_port(), metrics_port=_free_port())
    rows: list[Row] = []
    with _process(master.argv(), workdir / "master.log"):
        store_probe.wait_for_master(master.health_url(LOOPBACK), timeout_s=30)
        address = master.client_master_address(LOOPBACK)

        embedded = MooncakeStoreConfig(
            metadata_server=master.metadata_server(LOOPBACK),
            master_server_address=address,
            protocol="tcp",
            mode="embedded",
            global_segment_size=POOL,
            local_buffer_size=LOCAL_BUFFER,
        )
        store = store_probe.open_store(embedded, LOOPBACK)
        try:
            rows += [_measure(store, "embedded", size, total) for size in VALUE_SIZES]
        finally:
            store.close()

        owner = StoreClientConfig(
            host=LOOPBACK,
            port=_free_port(),
            global_segment_size=POOL,
            master_server_address=address,
            metadata_server=master.metadata_server(LOOPBACK),
        )
        with _process(owner.argv(), workdir / "client.log", owner.env()):
            # The embedded requester's segment is gone once it closed; wait for the owner's alone.
            store_probe.wait_for_capacity(master.metrics_url(LOOPBACK), POOL, timeout_s=30)
            store = store_probe.open_store(owner.requester_config(LOCAL_BUFFER), LOOPBACK)
            try:
                rows += [_measure(store, "standalone-store", size, total) for size in VALUE_SIZES]
            finally:
                store.close()
    return rows


def table(rows: list[Row]) -> str:
    header = ["mode", "value", "count", "put GB/s", "get GB/s", "batch get GB/s", "put ops/s", "get ops/s"]
    cells = [header, *(row.cells() for row in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    lines = [
        "  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True)))
        for line in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--total-mib", type=int, default=128, help="bytes written per mode and value size (MiB)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="epd-bench-store-") as tmp:
        rows = run(args.total_mib * MiB, Path(tmp))
    print(
        f"Mooncake store put/get on loopback TCP, one requester, single-key put/get and get_batch; "
        f"{args.total_mib} MiB per row; {platform.machine()}, {os.cpu_count()} CPUs\n{table(rows)}"
    )


if __name__ == "__main__":
    main()
