"""A single master's restart keeps the store's objects: the master snapshots its metadata into a folder (as a
deployment renders it: the pod's work volume, which a restarted container keeps) and restores the last snapshot
when it starts again there. The store client's segment, which holds the bytes, lives on; it mounts on the new
master, and what was put before the last snapshot reads back. Without snapshots the same restart empties the
store (the control case).

Measured here (Mooncake 0.3.13, loopback): the restarted master serves ~0.1 s after it starts and the segment is
mounted again at once; the first read on each requester fails once with RPC_FAIL (its connection died with the
master) and is retried, as vLLM's next lookup would be.
"""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING, Any

import pytest

from epd_connectors import store_probe
from epd_connectors.config.master import SnapshotConfig
from epd_operator.render.bundles_store import SNAPSHOT_DIR_NAME

if TYPE_CHECKING:
    from .conftest import Mooncake

pytestmark = pytest.mark.store

KEYS = 20
INTERVAL_S = 1
"""Snapshots every second here (a deployment's default is 30 s), so the test need not wait long for one."""
RESTART_LIMIT_S = 30.0


def read_all(store: Any, prefix: str) -> list[bool]:
    """Whether each key reads back its bytes; a read that misses is tried once more (the first after a restart
    fails on the requester's dead connection, and Mooncake's get answers it with no bytes)."""
    return [any(store.get(f"{prefix}/{i}") == bytes([i]) * 4096 for _ in range(2)) for i in range(KEYS)]


def restart_and_read(mooncake: Mooncake, snapshot: SnapshotConfig | None) -> tuple[list[bool], float]:
    master = mooncake.master(snapshot=snapshot)
    client = mooncake.client(master)
    store = mooncake.requester(client.config.requester_config(local_buffer_size="16 MiB"))
    for i in range(KEYS):
        store_probe.probe(store, f"restart/{i}", bytes([i]) * 4096)
    time.sleep(3 * INTERVAL_S)  # at least one snapshot after the last put
    master.process.popen.send_signal(signal.SIGKILL)
    master.process.popen.wait()
    began = time.monotonic()
    again = mooncake.start_master(master.config, name="master-restarted")
    segment = client.config.global_segment_size
    while store_probe.master_capacity_bytes(again.metrics_url) < segment:
        assert time.monotonic() - began < RESTART_LIMIT_S, "the store client never mounted its segment again"
        time.sleep(0.05)
    return read_all(store, "restart"), time.monotonic() - began


def test_a_restarted_master_restores_its_last_snapshot(mooncake: Mooncake) -> None:
    folder = mooncake.workdir / "work" / SNAPSHOT_DIR_NAME  # absent: the master makes it
    kept, remounted_s = restart_and_read(mooncake, SnapshotConfig(interval_s=INTERVAL_S, path=str(folder)))
    print(f"\nsingle master restarted with snapshots: segment mounted again {remounted_s:.1f} s after the start; "
          f"{kept.count(True)} of {KEYS} objects read back")  # fmt: skip
    assert kept == [True] * KEYS
    assert any(folder.iterdir())


def test_without_snapshots_a_restart_empties_the_store(mooncake: Mooncake) -> None:
    kept, _ = restart_and_read(mooncake, None)
    assert kept == [False] * KEYS
