"""The real binaries accept what we render: flag names, size spellings, offload, and the health endpoint."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from typing import TYPE_CHECKING

import pytest

from epd_connectors import store_probe
from epd_connectors.config.master import HAConfig, MasterConfig, TenantQuotaPolicy
from epd_connectors.config.sizes import parse_size
from epd_connectors.config.store_client import StoreClientConfig

from .conftest import BIN_DIR, LOOPBACK, free_port

if TYPE_CHECKING:
    from .conftest import Mooncake

pytestmark = pytest.mark.store

MiB = 1024**2
_HELP_FLAG = re.compile(r"^\s+-(\w+) \(", re.MULTILINE)


def known_flags(binary: str) -> set[str]:
    done = subprocess.run([str(BIN_DIR / binary), "--help"], capture_output=True, text=True, timeout=30, check=False)
    return set(_HELP_FLAG.findall(done.stdout + done.stderr))


def rendered_flags(argv: list[str]) -> set[str]:
    return {arg[2:].split("=", 1)[0] for arg in argv[1:]}


@pytest.mark.usefixtures("mooncake_binaries")
def test_every_rendered_master_flag_exists() -> None:
    config = MasterConfig(
        rpc_address="10.0.0.5",
        metrics_host="10.0.0.5",
        enable_http_metadata_server=True,
        enable_multi_tenants=True,
        tenant_quota_policy=TenantQuotaPolicy(),
        tenant_quota_policy_path="/tmp/policy.yaml",
        enable_offload=True,
        ha=HAConfig(endpoints=("etcd:2379",), enable_oplog=True),
    )
    missing = rendered_flags(config.argv()) - known_flags("mooncake_master")
    assert not missing


@pytest.mark.usefixtures("mooncake_binaries")
def test_every_rendered_client_flag_exists() -> None:
    config = StoreClientConfig(
        host="10.0.0.5",
        global_segment_size=MiB,
        master_server_address="m:50051",
        enable_offload=True,
        offload_path="/mnt/ssd",
        enable_http_server=True,
    )
    missing = rendered_flags(config.argv()) - known_flags("mooncake_client")
    assert not missing


def test_master_health_is_json_ok(mooncake: Mooncake) -> None:
    master = mooncake.master()
    with urllib.request.urlopen(master.config.health_url(LOOPBACK), timeout=2) as response:
        body = json.loads(response.read())
    assert body["status"] == "ok"


def test_mooncake_reads_size_units_as_we_do(mooncake: Mooncake) -> None:
    # We render bytes; this pins why: Mooncake reads "64 MB" as 64 MiB (like parse_size), "64 MiB" as 0.
    master = mooncake.master()
    owner = StoreClientConfig(
        host=LOOPBACK, port=free_port(), global_segment_size="64 MB", master_server_address=master.address
    )
    argv = [
        arg if not arg.startswith("--global_segment_size=") else "--global_segment_size=64 MB" for arg in owner.argv()
    ]
    process = mooncake.spawn("client-units", argv)
    store_probe.wait_for_capacity(master.metrics_url, parse_size("64 MB"), timeout_s=20)
    assert store_probe.master_capacity_bytes(master.metrics_url) == parse_size("64 MB") == 64 * MiB

    binary_spelling = [a.replace("64 MB", "64 MiB") for a in argv]
    binary_spelling[2] = f"--port={free_port()}"
    process = mooncake.spawn("client-binary-units", binary_spelling)
    process.wait_for_log("Starting real client service")
    assert "Global segment size is 0, skip mounting segment" in process.log.read_text()
    assert store_probe.master_capacity_bytes(master.metrics_url) == 64 * MiB


def test_offload_trio_starts_and_serves(mooncake: Mooncake) -> None:
    master = mooncake.master(enable_offload=True)
    ssd = mooncake.workdir / "ssd"
    ssd.mkdir()
    owner = mooncake.client(master, global_segment_size="64 MiB", enable_offload=True, offload_path=str(ssd))
    config = owner.config.requester_config(local_buffer_size="16 MiB")
    assert config.enable_offload is True
    store = mooncake.requester(config)
    store_probe.probe(store, "offload/1", b"o" * MiB)
