"""Starting and stopping the control-plane processes, and remembering them in the state folder.

The processes outlive the command that started them (`make cluster-up` returns while the cluster runs), so
their pids are written down, and `down` stops exactly those. A pid is only signalled while its command line
still names our state folder: after a reboot or a crash the number may belong to someone else.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import time
from dataclasses import dataclass

STOP_GRACE_S = 10.0
"""Time a process gets to exit after SIGTERM before SIGKILL; etcd and the apiserver need about a second."""

STATE_FILE = "processes.json"

_children: dict[int, subprocess.Popen[bytes]] = {}
"""Processes started by this interpreter, kept so they are waited for (and never garbage-collected while
running, which Python reports as a ResourceWarning, an error under the test suite's warning filter)."""


@dataclass(frozen=True)
class Running:
    """A process we started."""

    name: str
    pid: int
    log: pathlib.Path


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports. All sockets stay open until every port is chosen, so none repeats."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def start(name: str, argv: list[str], log_dir: pathlib.Path, env: dict[str, str] | None = None) -> Running:
    """Start one process in its own session (so Ctrl-C in the caller's terminal leaves it alone); `env` adds to
    this process's environment."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **env} if env else None,
        )
    _children[process.pid] = process
    _wait_for_exec(process)
    return Running(name, process.pid, log)


def _wait_for_exec(process: subprocess.Popen[bytes], timeout_s: float = 2.0) -> None:
    # Popen returns after fork, before the child's exec has filled /proc/PID/cmdline (empty in 85 of 200
    # starts, measured): until then is_ours() would read the child as gone, bring-up would report it exited
    # and cleanup would skip it, leaving it running.
    deadline = time.monotonic() + timeout_s
    while not _cmdline(process.pid) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)


def _cmdline(pid: int) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _is_zombie(pid: int) -> bool:
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def is_ours(pid: int, state_dir: pathlib.Path) -> bool:
    """Alive, not a zombie, and its command line mentions our state folder (a child of this interpreter is
    asked directly: it cannot be a reused pid)."""
    child = _children.get(pid)
    if child is not None:
        return child.poll() is None
    return str(state_dir) in _cmdline(pid) and not _is_zombie(pid)


def _reap(pid: int) -> None:
    # Our own children (tests start clusters in-process) must be reaped or they linger as zombies.
    child = _children.pop(pid, None)
    if child is not None:
        child.wait(timeout=STOP_GRACE_S)


def _stop_one(p: Running, state_dir: pathlib.Path) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while is_ours(p.pid, state_dir) and time.monotonic() < deadline:
        time.sleep(0.02)
    if is_ours(p.pid, state_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)
    _reap(p.pid)


def stop(processes: list[Running], state_dir: pathlib.Path) -> list[str]:
    """Stop each process still ours, one after the other in the order given; returns their names.

    One at a time on purpose: an apiserver whose etcd vanished first waits out its whole shutdown timeout,
    while stopping clients, then the apiserver, then etcd takes about a second in all.
    """
    live = [p for p in processes if is_ours(p.pid, state_dir)]
    for p in live:
        _stop_one(p, state_dir)
    return [p.name for p in live]


def save(state_dir: pathlib.Path, processes: list[Running], extra: dict[str, object]) -> None:
    """Write the pids (rewritten after every start, so a failed `up` can still be taken down)."""
    record = {"processes": [{"name": p.name, "pid": p.pid, "log": str(p.log)} for p in processes], **extra}
    tmp = state_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(state_dir / STATE_FILE)


def load(state_dir: pathlib.Path) -> tuple[list[Running], dict[str, object]]:
    """The processes and extra data a previous `up` recorded; nothing when there is no record."""
    path = state_dir / STATE_FILE
    if not path.is_file():
        return [], {}
    record = json.loads(path.read_text())
    processes = [Running(p["name"], int(p["pid"]), pathlib.Path(p["log"])) for p in record.pop("processes", [])]
    return processes, record


def log_tail(log: pathlib.Path, lines: int = 15) -> str:
    """The end of a log, to show why a component stopped."""
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
