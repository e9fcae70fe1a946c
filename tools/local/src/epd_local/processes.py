"""Run a LocalPlan: one `epd-launch <role> --bundle FILE` process per instance, as a pod would run it.

Each instance gets a folder under the work directory (its bundle.json, epd-launch's workdir, vLLM's compile
cache) and one log file. Every process starts in its own session, so stopping it signals its whole group (the
vLLM API server and its engine core). `LocalDeployment.stop` stops everything it started, the proxy first and
the store last, and is idempotent; the CLI calls it on SIGINT/SIGTERM and the tests at teardown.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from epd_connectors.config.bundle import POD_IP_ENV
from epd_connectors.vllm_plugins.cpu_amx_tiles import isa_choices
from epd_local import failures
from epd_local import plan as local_plan
from epd_local.failures import LogWatch
from epd_local.plan import POD_IP, Instance, LocalPlan, Readiness
from epd_local.profile import LocalProfile

LAUNCH_MODULE: Final = "epd_connectors.launch.cli"
"""`python -m epd_connectors.launch.cli` is `epd-launch`; run with the chosen interpreter, so the vLLM it execs
is that environment's (`sys.executable -m vllm...`)."""
DEFAULT_START_DEADLINE_S: Final = 900.0
"""A tiny-model vLLM instance answers /health after about a minute on 2 idle cores; several at once take longer."""
STOP_GRACE_S: Final = 20.0
"""Seconds between SIGTERM and SIGKILL."""
PROGRESS_EVERY_S: Final = 15.0
FATAL_SETTLE_S: Final = 2.0
"""After a fatal log line, how long the instance may take to write the rest (its traceback) or to exit."""
PORT_RANGE: Final = (20000, 32000)
"""Where an address plan starts (below Linux's ephemeral ports, so the kernel's own picks never collide)."""
PLAN_ATTEMPTS: Final = 20
RPC_BASE_PATH_ENV: Final = "VLLM_RPC_BASE_PATH"
"""Where vLLM creates its ipc sockets (vllm/envs.py; the temp dir by default)."""


class StartError(RuntimeError):
    """An instance exited or stayed unready; ``str()`` is one line, ``log_tail`` the end of its log."""

    def __init__(self, line: str, log_tail: str) -> None:
        super().__init__(line)
        self.log_tail = log_tail


@dataclass
class Running:
    """One started instance."""

    instance: Instance
    popen: subprocess.Popen[bytes]
    log: Path
    started: float
    watch: LogWatch
    """Reads this life's part of the log (a restart appends to the same file)."""
    ready_after: float | None = None

    @property
    def name(self) -> str:
        return self.instance.name

    def alive(self) -> bool:
        return self.popen.poll() is None

    def failure(self) -> str | None:
        """Why the instance has failed, or None: it exited, or its log says a vLLM process of it died (its API
        server may live on, see `failures`)."""
        return failures.failure(self.popen.poll(), self.watch.fatal())

    def describe_failure(self, why: str) -> str:
        return f"{self.name} ({self.instance.role.value}) {why}; log {self.log}"

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM to the group, SIGKILL to what is left after STOP_GRACE_S."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=STOP_GRACE_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)


def is_ready(ready: Readiness) -> bool:
    """One probe: the URL answers 200, or the TCP port accepts a connection."""
    if ready.url is not None:
        try:
            with urllib.request.urlopen(ready.url, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False
    if ready.tcp is not None:
        try:
            with socket.create_connection(ready.tcp, timeout=2):
                return True
        except OSError:
            return False
    return True


def busy_ports(candidates: list[int]) -> frozenset[int]:
    """The candidates something already listens on (or that we may not bind) on loopback."""
    busy: set[int] = set()
    for port in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((POD_IP, port))
            except OSError:
                busy.add(port)
    return frozenset(busy)


def plan_on_free_ports(
    manifest: Path, workdir: Path, model: Path, chosen: LocalProfile, base_port: int | None = None
) -> LocalPlan:
    """The manifest's plan on ports that are free right now (replanned around any port found in use)."""
    owner, spec = local_plan.load_manifest(manifest)
    paths = local_plan.local_paths(workdir, model)
    base = base_port or random.randrange(*PORT_RANGE)
    taken: frozenset[int] = frozenset()
    for _ in range(PLAN_ATTEMPTS):
        plan = local_plan.plan_local(owner, spec, paths=paths, profile=chosen, base_port=base, taken=taken)
        busy = busy_ports(local_plan.all_ports(plan))
        if not busy:
            return plan
        taken |= busy
    raise local_plan.LocalPlanError([f"ports from {base}: kept finding ports in use. Fix: pass --base-port"])


def attention_note(log: Path, offset: int) -> str:
    """ " (attention isa=...)" when the log from `offset` on says which CPU attention kernels vLLM chose."""
    life = log.read_bytes()[offset:] if log.exists() else b""
    choices = dict.fromkeys(isa_choices(life.decode(errors="replace")))
    return f" (attention isa={'; isa='.join(choices)})" if choices else ""


@dataclass
class LocalDeployment:
    """The processes of one plan. Use as a context manager, or call `stop()` yourself."""

    plan: LocalPlan
    workdir: Path
    python: Path
    """The interpreter that runs epd-launch (its environment has vLLM, Mooncake and epd-connectors)."""
    say: Callable[[str], None] = print
    running: list[Running] = field(default_factory=list)

    def __enter__(self) -> LocalDeployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, only: set[str] | None = None) -> None:
        """Start every instance (or those whose role is in `only`), in the operator's order; epd-launch itself
        makes store users wait for the master, so nothing here waits between starts."""
        for folder in (self.plan.paths.shared_dir, self.plan.paths.work_dir, self.plan.paths.offload_dir):
            Path(folder).mkdir(parents=True, exist_ok=True)
        for sub in ("ec", "kv"):
            (Path(self.plan.paths.shared_dir) / sub).mkdir(exist_ok=True)
        for instance in self.plan.instances:
            if only is None or instance.role.value in only:
                self.running.append(self._start(instance))

    def _start(self, instance: Instance, *, again: bool = False) -> Running:
        folder = self.workdir / instance.name
        folder.mkdir(parents=True, exist_ok=True)
        bundle_path = folder / "bundle.json"
        bundle_path.write_text(instance.bundle_json, encoding="utf-8")
        log = folder / "log.txt"
        bin_dir = str(self.python.parent)
        env = {
            **os.environ,
            POD_IP_ENV: POD_IP,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "VIRTUAL_ENV": str(self.python.parent.parent),
            # Its own compile cache: instances sharing one race on it, and this CPU build recompiles anyway.
            "VLLM_CACHE_ROOT": str(folder / "vllm-cache"),
            "PYTHONUNBUFFERED": "1",
        }
        if instance.rpc_dir is not None:  # its own ipc sockets (plan.rpc_dir)
            Path(instance.rpc_dir).mkdir(parents=True, exist_ok=True)
            env[RPC_BASE_PATH_ENV] = instance.rpc_dir
        argv = [str(self.python), "-m", LAUNCH_MODULE, instance.role.value]
        argv += ["--bundle", str(bundle_path), "--workdir", str(folder / "launch")]
        # A restarted instance keeps writing the same log, as `kubectl logs --previous` keeps the last life.
        with log.open("ab" if again else "wb") as out:
            if again:
                out.write(f"--- epd-local: restarted {instance.name} ---\n".encode())
                out.flush()
            watch = LogWatch(log, offset=out.tell())
            popen = subprocess.Popen(  # stopped by stop(); its own session, so its group can be signalled
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=folder, start_new_session=True
            )
        what = "restarted" if again else "started"
        self.say(f"{what} {instance.name} ({instance.role.value}, {instance.ready.describe()}), log {log}")
        return Running(instance, popen, log, time.monotonic(), watch)

    def get(self, name: str) -> Running:
        """The running instance called `name` (KeyError naming the known ones otherwise)."""
        for run in self.running:
            if run.name == name:
                return run
        raise KeyError(f"{name} is not running here; running: {', '.join(r.name for r in self.running)}")

    def kill(self, name: str) -> None:
        """SIGKILL the instance's whole process group, as a crash or an OOM kill would end a pod's container,
        and wait until it is gone. It stays in `running`: `restart` starts it again."""
        run = self.get(name)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(run.popen.pid, signal.SIGKILL)
        run.popen.wait(timeout=10)
        self.say(f"killed  {name}")

    def restart(self, name: str, deadline_s: float = DEFAULT_START_DEADLINE_S) -> Running:
        """Start the instance again the way a Deployment restarts its pod: the same argv, bundle, ports and
        environment (stopped first if it still runs); wait until it is ready. Nothing else is touched."""
        old = self.get(name)
        old.stop()
        run = self._start(old.instance, again=True)
        self.running[self.running.index(old)] = run
        self.wait_ready(deadline_s, [run])
        return run

    def wait_ready(self, deadline_s: float = DEFAULT_START_DEADLINE_S, runs: list[Running] | None = None) -> None:
        """Until every started instance (or each of `runs`) is ready; progress lines while waiting; StartError
        for the first one that fails (exits, or logs that vLLM's engine died: it is stopped at once, never
        waited for) or misses the deadline."""
        pending = list(self.running if runs is None else runs)
        last_note = time.monotonic()
        while pending:
            for run in list(pending):
                elapsed = time.monotonic() - run.started
                if (why := run.failure()) is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        run.popen.wait(timeout=FATAL_SETTLE_S)  # the rest of its traceback
                    run.stop()
                    raise StartError(run.describe_failure(f"failed before it was ready: {why}"), run.tail())
                if is_ready(run.instance.ready):
                    run.ready_after = elapsed
                    pending.remove(run)
                    self.say(
                        f"ready   {run.name} after {elapsed:.0f}s{attention_note(run.log, run.watch.offset_at_start)}"
                    )
                elif elapsed > deadline_s:
                    raise StartError(
                        run.describe_failure(f"not ready after {deadline_s:.0f}s at {run.instance.ready.describe()}"),
                        run.tail(),
                    )
            if pending and time.monotonic() - last_note >= PROGRESS_EVERY_S:
                last_note = time.monotonic()
                waiting = ", ".join(f"{r.name} ({time.monotonic() - r.started:.0f}s)" for r in pending)
                self.say(f"waiting for {waiting}")
            if pending:
                time.sleep(0.5)

    def failed(self) -> list[tuple[Running, str]]:
        """Instances that have failed since they started (exited, or logged a vLLM engine's death), with why."""
        return [(run, why) for run in self.running if (why := run.failure()) is not None]

    def stop(self) -> None:
        """Stop everything this deployment started: the proxy and the vLLM roles together, then the store
        clients, then the master (a store user outliving its master only logs reconnects)."""
        waves: list[list[Running]] = [
            [r for r in self.running if r.instance.role.value not in ("master", "store-client")],
            [r for r in self.running if r.instance.role.value == "store-client"],
            [r for r in self.running if r.instance.role.value == "master"],
        ]
        for wave in waves:
            if wave:
                with ThreadPoolExecutor(max_workers=len(wave)) as pool:
                    list(pool.map(Running.stop, wave))
        for run in self.running:
            if run.instance.rpc_dir is not None:  # outside the workdir (plan.RPC_ROOT): nothing else removes it
                shutil.rmtree(run.instance.rpc_dir, ignore_errors=True)
        if self.running:
            self.say(f"stopped {len(self.running)} processes")
        self.running.clear()


@contextlib.contextmanager
def deployment(
    plan: LocalPlan,
    workdir: Path,
    python: Path,
    *,
    say: Callable[[str], None] = print,
    only: set[str] | None = None,
    deadline_s: float = DEFAULT_START_DEADLINE_S,
) -> Iterator[LocalDeployment]:
    """Started and ready; stopped on the way out, whatever happens (also when starting fails)."""
    local = LocalDeployment(plan, workdir, python, say)
    try:
        local.start(only)
        local.wait_ready(deadline_s)
        yield local
    finally:
        local.stop()
