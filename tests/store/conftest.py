"""Real mooncake_master / mooncake_client processes on loopback, started from the argv our models render.

Every process gets free ports, its own working directory and a log file; the fixture stops what it started
(requesters first, then store owners, then the master) and prints the logs when a test fails. We always wait
for the master's /health before a client or requester starts: ``setup()`` with no master blocks ~90 s.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from epd_connectors import store_probe
from epd_connectors.config.master import MasterConfig
from epd_connectors.config.mooncake import MooncakeStoreConfig
from epd_connectors.config.store_client import StoreClientConfig

LOOPBACK = "127.0.0.1"
REPO = Path(__file__).resolve().parents[2]
BIN_DIR = Path(sys.executable).parent
"""The venv's bin: mooncake-transfer-engine-non-cuda installs mooncake_master and mooncake_client there."""
START_TIMEOUT_S = 20.0
"""A master answers /health in ~0.5 s and a client mounts in ~0.2 s here; 20 s leaves room on a busy box."""


def free_port() -> int:
    """A port nothing listens on right now (the kernel's pick; a tiny race is acceptable in tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


@dataclass
class Process:
    """A started binary and where its output goes."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_for_log(self, needle: str, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until the process has logged ``needle`` (for states no endpoint reports)."""
        deadline = time.monotonic() + timeout_s
        while needle not in self.log.read_text(errors="replace"):
            if not self.alive() or time.monotonic() > deadline:
                pytest.fail(f"{self.name}: {needle!r} not logged:\n{self.tail()}")
            time.sleep(0.05)

    def stop(self) -> None:
        # SIGKILL: a graceful SIGTERM costs ~1 s per process and these processes hold nothing worth keeping.
        if self.alive():
            self.popen.kill()
        self.popen.wait(timeout=10)


def health(config: MasterConfig) -> dict[str, Any] | None:
    """The master's /health JSON, or None while it does not answer."""
    try:
        with urllib.request.urlopen(config.health_url(LOOPBACK), timeout=1) as response:
            body: dict[str, Any] = json.loads(response.read())
            return body
    except OSError:
        return None


def _serves(config: MasterConfig) -> bool:
    try:
        store_probe.wait_for_master(config.health_url(LOOPBACK), timeout_s=0)
    except TimeoutError:
        return False
    return True


@dataclass
class RunningMaster:
    config: MasterConfig
    process: Process

    @property
    def address(self) -> str:
        return self.config.client_master_address(LOOPBACK)

    @property
    def metrics_url(self) -> str:
        return self.config.metrics_url(LOOPBACK)

    def store_config(self, **fields: Any) -> MooncakeStoreConfig:
        """A vLLM JSON pointing at this master (embedded, tcp, small buffers unless overridden)."""
        data: dict[str, Any] = {
            "metadata_server": self.config.metadata_server(LOOPBACK),
            "master_server_address": self.address,
            "protocol": "tcp",
            "mode": "embedded",
            "global_segment_size": "64 MiB",
            "local_buffer_size": "32 MiB",
        }
        data.update(fields)
        return MooncakeStoreConfig.model_validate(data)


@dataclass
class RunningClient:
    config: StoreClientConfig
    process: Process


@dataclass
class Mooncake:
    """Starts Mooncake processes and requesters for one test and stops them all afterwards."""

    workdir: Path
    processes: list[Process] = field(default_factory=list)
    stores: list[Any] = field(default_factory=list)

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        log = self.workdir / f"{name}.log"
        if "/" not in argv[0]:
            argv = [str(BIN_DIR / argv[0]), *argv[1:]]
        with log.open("wb") as out:
            popen = subprocess.Popen(
                argv, cwd=self.workdir, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
            )
        process = Process(name, popen, log)
        self.processes.append(process)
        return process

    def _wait(self, process: Process, what: str, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            if not process.alive():
                pytest.fail(f"{process.name} exited ({process.popen.returncode}) before {what}:\n{process.tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"{process.name}: no {what} after {START_TIMEOUT_S} s:\n{process.tail()}")
            time.sleep(0.05)

    def master(self, *, serving: bool = True, **fields: Any) -> RunningMaster:
        """Start a master on free loopback ports; returns once /health says it serves (``serving``), or once
        it answers at all (an HA standby never serves)."""
        data: dict[str, Any] = {"rpc_address": LOOPBACK, "rpc_port": free_port(), "metrics_port": free_port()}
        if fields.get("enable_http_metadata_server"):
            data["http_metadata_server_port"] = free_port()
        if fields.get("enable_multi_tenants"):
            data["tenant_quota_policy_path"] = str(self.workdir / "tenant_quota.yaml")
        data.update(fields)
        config = MasterConfig.model_validate(data)
        for path, content in config.files().items():
            Path(path).write_text(content)
        return self.start_master(config, serving=serving)

    def start_master(self, config: MasterConfig, *, serving: bool = True, name: str = "") -> RunningMaster:
        """Start a master of `config` (again, after one was stopped: a restart), with the environment the
        launcher gives it."""
        process = self.spawn(name or f"master-{config.rpc_port}", config.argv(), config.env())
        self._wait(process, "/health", lambda: health(config) is not None and (not serving or _serves(config)))
        return RunningMaster(config, process)

    def client(self, master: RunningMaster, **fields: Any) -> RunningClient:
        """Start a store owner for ``master``; returns once the master counts its segment in the pool."""
        data: dict[str, Any] = {
            "host": LOOPBACK,
            "port": free_port(),
            "global_segment_size": "256 MiB",
            "master_server_address": master.address,
            "metadata_server": master.config.metadata_server(LOOPBACK),
            "protocol": "tcp",
        }
        data.update(fields)
        config = StoreClientConfig.model_validate(data)
        before = store_probe.master_capacity_bytes(master.metrics_url)
        process = self.spawn(f"client-{config.port}", config.argv(), config.env())
        wanted = before + config.global_segment_size
        self._wait(process, "mounted segment", lambda: store_probe.master_capacity_bytes(master.metrics_url) >= wanted)
        return RunningClient(config, process)

    def etcd(self) -> str:
        """Start a single-member etcd for HA masters; returns its client endpoint HOST:PORT."""
        binary = shutil.which("etcd") or str(REPO / ".cache" / "bin" / "etcd")
        if not Path(binary).is_file():
            pytest.fail("no etcd binary: build it into .cache/bin with `make setup-k8s-tools` (make test does)")
        client, peer = f"http://{LOOPBACK}:{free_port()}", f"http://{LOOPBACK}:{free_port()}"
        argv = [
            binary,
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
        ]
        process = self.spawn("etcd", argv)

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1) as response:
                    return b'"true"' in response.read()
            except OSError:
                return False

        self._wait(process, "etcd /health", healthy)
        return client.removeprefix("http://")

    def requester(self, config: MooncakeStoreConfig) -> Any:
        """A MooncakeDistributedStore set up from ``config`` as vLLM would; closed at teardown."""
        store = store_probe.open_store(config, LOOPBACK)
        self.stores.append(store)
        return store

    def close(self) -> None:
        # close() takes ~1 s per store (it joins Mooncake's background threads), so close them together;
        # the same goes for stopping processes (~1 s each), once no requester depends on them.
        with ThreadPoolExecutor() as pool:
            list(pool.map(lambda store: store.close(), self.stores))
        self.stores.clear()
        owners = [p for p in self.processes if not p.name.startswith("master")]
        with ThreadPoolExecutor() as pool:
            list(pool.map(Process.stop, owners))
            list(pool.map(Process.stop, [p for p in self.processes if p not in owners]))

    def logs(self) -> str:
        return "\n".join(f"----- {p.name} ({p.log}) -----\n{p.tail(60)}" for p in self.processes)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    # Remember each phase's outcome on the item, so the fixture knows at teardown whether to show the logs.
    report = yield
    setattr(item, f"_mooncake_{report.when}_failed", report.failed)
    return report


@pytest.fixture(scope="session")
def mooncake_binaries() -> None:
    """Fail early and clearly when the binaries cannot load (libibverbs1 missing: `make setup-apt`)."""
    for binary in ("mooncake_master", "mooncake_client"):
        done = subprocess.run(
            [str(BIN_DIR / binary), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
        if "error while loading shared libraries" in done.stderr:
            pytest.fail(f"{binary} cannot start: {done.stderr.strip()}. Fix: run `make setup-apt`")


@pytest.fixture
def mooncake(tmp_path: Path, request: pytest.FixtureRequest, mooncake_binaries: None) -> Iterator[Mooncake]:
    """Processes and requesters for one test; stopped afterwards, logs printed when the test failed."""
    instance = Mooncake(tmp_path)
    try:
        yield instance
    finally:
        instance.close()
        if getattr(request.node, "_mooncake_call_failed", False):
            print(instance.logs())
