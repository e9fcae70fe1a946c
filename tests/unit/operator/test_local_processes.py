"""The local runner's bookkeeping: `restart` stops the old process and starts the same instance again in its place
(so `stop` keeps its order), marking the start as a restart; `get` names what runs (without processes); an
instance whose log says its vLLM engine died is a failed start at once, and its whole process group is stopped
(small real processes that print vLLM's line and then hang, as its API server does). The real thing (a master
killed and restarted under its store client) is tests/store/test_local_runner_store.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from epd_local import failures, processes, profile
from epd_local import plan as local_plan
from epd_local.failures import LogWatch

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
        log = tmp_path / f"{instance.name}.log"
        local.running.append(processes.Running(instance, popen, log, 0.0, LogWatch(log)))
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
        return processes.Running(instance, popen, old.log, 1.0, LogWatch(old.log))

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


HANGS_AFTER = "import sys, time; print({line!r}, flush=True); time.sleep(600)"
"""A process that logs `line` and then hangs, as vLLM's API server does when its engine core died while starting."""


def _hanging(tmp_path: Path, local: processes.LocalDeployment, name: str, line: str) -> processes.Running:
    instance = local.get(name).instance
    log = tmp_path / f"{name}-real.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [sys.executable, "-c", HANGS_AFTER.format(line=line)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return processes.Running(instance, popen, log, time.monotonic(), LogWatch(log))


def test_an_instance_whose_log_says_the_engine_died_fails_at_once_and_is_stopped(tmp_path: Path) -> None:
    local = _deployment(tmp_path)
    run = _hanging(tmp_path, local, "local-e-p-d-prefill", "ERROR [core.py:1510] EngineCore failed to start.")
    begun = time.monotonic()
    with pytest.raises(processes.StartError) as failed:
        local.wait_ready(deadline_s=300, runs=[run])
    assert str(failed.value).startswith(
        "local-e-p-d-prefill (prefill) failed before it was ready: its log says "
        "'ERROR [core.py:1510] EngineCore failed to start.'"
    )
    assert "EngineCore failed to start." in failed.value.log_tail
    assert time.monotonic() - begun < 60, "it waited for the process instead of stopping it"
    assert not run.alive()
    with pytest.raises(ProcessLookupError):
        os.killpg(run.popen.pid, 0)  # the whole group is gone


def test_a_running_instance_that_logs_a_fatal_error_is_failed(tmp_path: Path) -> None:
    local = _deployment(tmp_path)
    local.running[:] = [_hanging(tmp_path, local, "local-e-p-d-decode", "Fatal Python error: Illegal instruction")]
    try:
        deadline = time.monotonic() + 30
        while not (failed := local.failed()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [(run.name, why) for run, why in failed] == [
            ("local-e-p-d-decode", "its log says 'Fatal Python error: Illegal instruction'")
        ]
    finally:
        local.stop()


def test_a_restart_reads_only_its_own_life_of_the_log(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    log.write_text("EngineCore encountered a fatal error.\n--- epd-local: restarted x ---\n")
    again = LogWatch(log, offset=log.stat().st_size)
    assert again.fatal() is None
    with log.open("a") as out:
        out.write("INFO serving\nEngine core initialization failed. See root cause above.")
    assert again.fatal() is None, "a line still being written is not read yet"
    with log.open("a") as out:
        out.write("\n")
    assert again.fatal() == "Engine core initialization failed. See root cause above."


@pytest.mark.parametrize(
    ("log", "line"),
    [
        (
            "INFO ready\nERROR 12-01 [core.py:1510] EngineCore failed to start.\nTraceback ...",
            "EngineCore failed to start.",
        ),
        ("ERROR [core.py:1512] EngineCore encountered a fatal error.\n", "EngineCore encountered a fatal error."),
        (
            "RuntimeError: Engine core initialization failed. See root cause above.",
            "Engine core initialization failed.",
        ),
        ("Fatal Python error: Illegal instruction\n\nThread 0x01", "Fatal Python error: Illegal instruction"),
        ("INFO Application startup complete.\nWARNING an EngineCore warning", None),
    ],
    ids=["start", "serving", "api-server", "signal", "healthy"],
)
def test_the_fatal_line_of_a_vllm_log(log: str, line: str | None) -> None:
    found = failures.fatal_line(log)
    assert (found is None) if line is None else (found is not None and line in found)


def test_a_failure_names_the_exit_and_what_the_log_said() -> None:
    assert failures.failure(None, None) is None
    assert failures.failure(1, None) == "exited with code 1"
    assert failures.failure(None, "X") == "its log says 'X'"
    assert failures.failure(-4, "X") == "exited with code -4; its log says 'X'"
