"""E+PD with ECExampleConnector over a shared folder: examples/local-e-pd.yaml run by the local runner (the
operator's own render on a loopback site, every role started by `epd-launch`: what `make demo-local` runs), its
encoder, its PD consumer and its proxy shared by the modules of this folder and stopped when the last of them is
done (so the next folder's instances never overlap them)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from epd_connectors.config.roles import Role
from epd_local import processes, profile
from epd_local.processes import Running
from tests.e2e.conftest import REPO, TIMINGS, Launcher, VllmInstance, local_example

EXAMPLE = REPO / "examples" / "local-e-pd.yaml"


@dataclass
class Fleet:
    """The session's baseline, and the example's encoder with its PD consumer (ECExampleConnector over a shared
    folder) and its proxy."""

    baseline: VllmInstance
    encoder: VllmInstance
    pd: VllmInstance
    ec_folder: Path
    endpoint: str
    """The example's own proxy."""


def fleet_dir(launcher: Launcher) -> Path:
    """The example's work folder; its EC folder is shared/ec in it (known before it starts: the spares share it)."""
    return launcher.workdir / "local-e-pd"


def fleet_ec_folder(launcher: Launcher) -> Path:
    return fleet_dir(launcher) / "shared" / "ec"


def as_instance(run: Running) -> VllmInstance:
    """A role the runner started, as the tier's other instances are read (it stays the runner's to stop)."""
    return VllmInstance(run.name, run.instance.bundle, run.popen, run.log, run.started, run.watch, ready=True)


@pytest.fixture(scope="package")
def fleet(
    request: pytest.FixtureRequest, launcher: Launcher, baseline_started: VllmInstance, tiny_model: Path
) -> Iterator[Fleet]:
    """The example started by the local runner together with the session's baseline (about 60 s for the three on
    2 idle cores when this folder runs first); stopped when the folder is done."""
    workdir = fleet_dir(launcher)
    workdir.mkdir(parents=True, exist_ok=True)
    plan = processes.plan_on_free_ports(EXAMPLE, workdir, tiny_model, profile.CPU)
    assert [i.role.value for i in plan.instances] == ["encoder", "pd", "proxy"]
    started = time.monotonic()
    with local_example(request, plan, workdir, launcher.python, "local-e-pd") as local:
        launcher.wait_healthy([baseline_started])
        TIMINGS.add("ec_example: the local runner's E+PD and proxy ready (wall)", time.monotonic() - started)
        roles = {run.instance.role: run for run in local.running}
        yield Fleet(
            baseline=baseline_started,
            encoder=as_instance(roles[Role.ENCODER]),
            pd=as_instance(roles[Role.PD]),
            ec_folder=fleet_ec_folder(launcher),
            endpoint=plan.endpoint,
        )
        assert not local.failed(), f"a role of the example died: {local.failed()}"
    assert not local.running
