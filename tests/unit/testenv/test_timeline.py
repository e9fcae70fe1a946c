"""make test's timeline: a stage's own steps under it, stages beside each other flat, the slowest tests from the
JUnit files, the verdict; what a stage's command records names that stage as its parent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from epd_testenv import timeline

pytestmark = pytest.mark.unit

SCRIPT = Path(timeline.__file__)


def test_a_stages_own_steps_are_under_it_and_stages_beside_each_other_are_not() -> None:
    stages = [
        timeline.Stage("go builds", 0, 100),
        timeline.Stage("go build: kube", 1, 60, parent="go builds"),
        timeline.Stage("virtualenv", 2, 30),
        timeline.Stage("pytest: e2e", 100, 200, rc=1),
    ]
    text = timeline.report(stages, [], started=0, ended=200, rc=1)
    assert "  go builds\n" in text and "    go build: kube\n" in text
    assert "  virtualenv\n" in text, "a stage that ran beside another is not under it"
    assert "pytest: e2e  FAILED" in text and text.rstrip().endswith("total 3 min 20 s, FAILED (rc 1)")


def test_the_slowest_tests_come_from_every_junit_file(tmp_path: Path) -> None:
    for run, cases in {"tiers": [("a", 3.0), ("b", 90.0)], "e2e": [("c", 400.0)]}.items():
        body = "".join(f'<testcase classname="tests.m" name="{n}" time="{t}"/>' for n, t in cases)
        (tmp_path / f"junit-{run}.xml").write_text(f"<testsuites><testsuite>{body}</testsuite></testsuites>")
    times = timeline.test_times(tmp_path)
    assert [(t.nodeid, t.run) for t in times] == [
        ("tests.m::c", "e2e"),
        ("tests.m::b", "tiers"),
        ("tests.m::a", "tiers"),
    ]


def test_a_stages_command_records_its_steps_under_it(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    env = {**os.environ, timeline.ENV: str(folder / "stages.jsonl")}
    env.pop(timeline.PARENT_ENV, None)
    step = f"{sys.executable} {SCRIPT} --dir {folder} record step 0"
    for argv in (["begin"], ["stage", "outer", "--", "sh", "-c", f"{step}; exit 3"]):
        done = subprocess.run([sys.executable, str(SCRIPT), "--dir", str(folder), *argv], env=env, check=False)
    assert done.returncode == 3, "a stage exits as its command did"
    lines = [json.loads(line) for line in (folder / "stages.jsonl").read_text().splitlines()]
    assert [(r["name"], r["parent"], r["rc"]) for r in lines] == [("step", "outer", 0), ("outer", "", 3)]
