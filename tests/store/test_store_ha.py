"""Two HA masters elected through etcd, rendered by `MasterConfig(ha=...)`; a requester finds the leader through
the etcd:// address the model gives clients. Needs an etcd binary (skipped without one)."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest

from epd_connectors import store_probe
from epd_connectors.config.master import HAConfig

from .conftest import health

if TYPE_CHECKING:
    from .conftest import Mooncake

pytestmark = pytest.mark.store


def test_requester_reaches_the_elected_leader_through_etcd(mooncake: Mooncake) -> None:
    ha = HAConfig(endpoints=(mooncake.etcd(),))
    first = mooncake.master(serving=False, ha=ha)
    second = mooncake.master(serving=False, ha=ha)
    assert first.address == second.address == f"etcd://{ha.endpoints[0]}"

    # One leader, one standby; both answer /health 200, only the leader comes to serve.
    deadline = time.monotonic() + 20
    while True:
        roles = {(health(m.config) or {}).get("role"): m for m in (first, second)}
        if set(roles) == {"leader", "standby"} or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert set(roles) == {"leader", "standby"}
    store_probe.wait_for_master(roles["leader"].config.health_url("127.0.0.1"), timeout_s=20)
    with pytest.raises(TimeoutError, match=r'"role":"standby"'):
        store_probe.wait_for_master(roles["standby"].config.health_url("127.0.0.1"), timeout_s=0)

    # The requester runs in its own process: an HA client's close() waits up to 30 s for its leader watch
    # (Mooncake 0.3.13, Client::LeaderMonitorThreadMain), so it ends with os._exit instead.
    config_path = mooncake.workdir / "mooncake_config.json"
    config_path.write_text(first.store_config(global_segment_size="32 MiB", local_buffer_size="16 MiB").to_json())
    done = subprocess.run(
        [sys.executable, "-c", _REQUESTER, str(config_path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok 4096"


_REQUESTER = """
import os, sys
from pathlib import Path
from epd_connectors import store_probe
from epd_connectors.config.mooncake import MooncakeStoreConfig
config = MooncakeStoreConfig.from_json(Path(sys.argv[1]).read_text())
store = store_probe.open_store(config, "127.0.0.1")  # kept referenced: its destructor would close it
result = store_probe.probe(store, "ha/1", b"h" * 4096)
print("ok", result.size, flush=True)
os._exit(0)
"""
