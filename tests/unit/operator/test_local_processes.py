"""The local runner's restart bookkeeping, without processes: `restart` stops the old process and starts the same
instance again in its place (so `stop` keeps its order), marking the start as a restart; `get` names what runs.
The real thing (a master killed and restarted under its store client) is tests/store/test_local_runner_store.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from epd_operator.local import plan as local_plan
from epd_operator.local import processes, profile

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "local-e-p-d.yaml"


class _Popen:
    """Stands in for a process that has exited."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode = 0

    def poll(self) -> int:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0


def _deployment(tmp_path: Path) -> processes.LocalDeployment:
    owner, spec = local_plan.load_manifest(EXAMPLE)
    paths = local_plan.local_paths(tmp_path, tmp_path / "model")
    plan = local_plan.plan_local(owner, spec, paths=paths, profile=profile.CPU, base_port=30000)
    local = processes.LocalDeployment(plan, tmp_path, Path("python"), say=lambda line: None)
    for pid, instance in enumerate(plan.instances, start=100):
        popen: Any = _Popen(pid)
        local.running.append(processes.Running(instance, popen, tmp_path / f"{instance.name}.log", 0.0))
    return local


def test_get_names_the_running_instances(tmp_path: Path) -> None:
    local = _deployment(tmp_path)
    assert local.get("local-e-p-d-master").popen.pid == 100
    with pytest.raises(KeyError, match="local-e-p-d-decode"):
        local.get("nothing")


def test_restart_starts_the_same_instance_again_in_its_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local = _deployment(tmp_path)
    names = [run.name for run in local.running]
    old = local.get("local-e-p-d-master")
    started: list[tuple[str, bool]] = []
    waited: list[list[str]] = []

    def fake_start(instance: local_plan.Instance, *, again: bool = False) -> processes.Running:
        started.append((instance.name, again))
        popen: Any = _Popen(999)
        return processes.Running(instance, popen, old.log, 1.0)

    monkeypatch.setattr(local, "_start", fake_start)
    monkeypatch.setattr(local, "wait_ready", lambda deadline_s, runs: waited.append([r.name for r in runs]))
    monkeypatch.setattr(os, "killpg", lambda pid, sig: None)  # the fake processes have no group
    new = local.restart("local-e-p-d-master")
    assert started == [("local-e-p-d-master", True)]
    assert waited == [["local-e-p-d-master"]]
    assert new.instance is old.instance and new.popen.pid == 999
    assert [run.name for run in local.running] == names
    assert local.get("local-e-p-d-master") is new


def test_the_argv_of_a_restart_is_the_argv_of_the_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same command, same bundle, same environment; the log is appended to, after a marker line."""
    local = _deployment(tmp_path)
    master = local.get("local-e-p-d-master").instance
    calls: list[dict[str, Any]] = []

    def fake_popen(argv: list[str], **kwargs: Any) -> _Popen:
        calls.append({"argv": argv, "env": kwargs["env"], "cwd": kwargs["cwd"]})
        return _Popen(1)

    monkeypatch.setattr(subprocess, "Popen", fake_popen)
    first = local._start(master)
    first.log.write_text("first life\n")
    again = local._start(master, again=True)
    assert calls[0] == calls[1]
    assert again.log == first.log
    assert again.log.read_text().startswith("first life\n--- epd-local: restarted local-e-p-d-master ---")
