"""Where a `make test` run's time goes: every stage's wall time, the slowest tests, the total.

Stages append one JSON line each to the file named by $EPD_TIMELINE (hack/test.sh sets it; nothing is recorded
when it is unset): the shell wraps whole commands (`timeline.py stage NAME -- CMD`), the set-up scripts record
their own steps (each Go build, each image), and epd_testenv records cluster starts and image copies. The report
reads those lines and the pytest runs' JUnit files beside them.

Standard library only: hack/test.sh runs it with the machine's python3 before any virtualenv exists.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass

ENV = "EPD_TIMELINE"
"""The stages file of the run in progress."""
PARENT_ENV = "EPD_TIMELINE_PARENT"
"""The stage a process runs inside (set for a stage's command): its own steps are listed under it."""
SLOWEST = 25


@dataclass(frozen=True)
class Stage:
    name: str
    start: float
    end: float
    rc: int = 0
    parent: str = ""

    @property
    def wall_s(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class TestTime:
    nodeid: str
    seconds: float
    run: str
    """The pytest run (its JUnit file's name) the test was in."""


def record(name: str, start: float, end: float | None = None, rc: int = 0) -> None:
    """Append a finished stage (epoch seconds) to the run's file; nothing outside a timed run."""
    path = os.environ.get(ENV)
    if not path:
        return
    finished = time.time() if end is None else end
    parent = os.environ.get(PARENT_ENV, "")
    line = json.dumps({"name": name, "start": start, "end": finished, "rc": rc, "parent": parent})
    with open(path, "a", encoding="utf-8") as out:  # one short write: concurrent stages do not interleave
        out.write(line + "\n")


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Record the block as a stage, failed (rc 1) when it raises."""
    start, rc = time.time(), 1
    outer = os.environ.get(PARENT_ENV)
    os.environ[PARENT_ENV] = name
    try:
        yield
        rc = 0
    finally:
        if outer is None:
            os.environ.pop(PARENT_ENV, None)
        else:
            os.environ[PARENT_ENV] = outer
        record(name, start, rc=rc)


def load(path: pathlib.Path) -> list[Stage]:
    stages = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            raw = json.loads(line)
            stages.append(
                Stage(
                    str(raw["name"]),
                    float(raw["start"]),
                    float(raw["end"]),
                    int(raw.get("rc", 0)),
                    str(raw.get("parent", "")),
                )
            )
    return sorted(stages, key=lambda s: s.start)


def test_times(folder: pathlib.Path) -> list[TestTime]:
    """Every test case of the JUnit files in `folder` (pytest's time: setup, call and teardown together)."""
    times = []
    for junit in sorted(folder.glob("junit-*.xml")):
        with contextlib.suppress(ET.ParseError):
            for case in ET.parse(junit).getroot().iter("testcase"):
                nodeid = f"{case.get('classname', '')}::{case.get('name', '')}"
                times.append(TestTime(nodeid, float(case.get("time") or 0), junit.stem.removeprefix("junit-")))
    return sorted(times, key=lambda t: t.seconds, reverse=True)


def clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}:{secs:02d}"


def duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs:02d} s" if minutes else f"{seconds:.1f} s"


def machine() -> str:
    """The CPU as machines of one kind differ: model, family/model numbers and the kernel flags vLLM picks by."""
    info: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if not line.strip():
                break  # the first processor only
            info.setdefault(key.strip(), value.strip())
    flags = set(info.get("flags", "").split())
    has = [flag for flag in ("amx_tile", "avx512_bf16", "avx512f") if flag in flags]
    model = info.get("model name") or platform.processor() or "unknown CPU"
    return (
        f"{model} (family {info.get('cpu family', '?')} model {info.get('model', '?')}; "
        f"{', '.join(has) or 'no AVX-512'}), {os.cpu_count()} cores"
    )


def report(stages: list[Stage], tests: list[TestTime], *, started: float, ended: float, rc: int) -> str:
    """The timeline: each stage from the run's start (a stage's own steps indented under it; stages that ran
    beside each other start before the other ends),
    the slowest tests, the total."""
    lines = [
        f"make test timeline: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, {machine()}",
        f"{'from':>7} {'wall':>12}  stage",
    ]
    parents = {s.name: s.parent for s in stages}
    for current in stages:
        depth, above = 0, current.parent
        while above and depth < len(stages):
            depth, above = depth + 1, parents.get(above, "")
        failed = "  FAILED" if current.rc else ""
        lines.append(
            f"{clock(current.start - started):>7} {duration(current.wall_s):>12}  {'  ' * depth}{current.name}{failed}"
        )
    if tests:
        lines.append(f"the {min(SLOWEST, len(tests))} slowest tests (setup, call and teardown; of {len(tests)}):")
        lines += [f"{duration(t.seconds):>12}  [{t.run}] {t.nodeid}" for t in tests[:SLOWEST]]
    verdict = "passed" if rc == 0 else f"FAILED (rc {rc})"
    lines.append(f"total {duration(ended - started)}, {verdict}")
    return "\n".join(lines) + "\n"


def _begin(folder: pathlib.Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for old in [*folder.glob("junit-*.xml"), folder / "stages.jsonl"]:
        old.unlink(missing_ok=True)
    (folder / "started").write_text(f"{time.time()}\n")


def _stage(folder: pathlib.Path, name: str, argv: list[str]) -> int:
    os.environ.setdefault(ENV, str(folder / "stages.jsonl"))
    start = time.time()
    rc = subprocess.call(argv, env={**os.environ, PARENT_ENV: name})
    record(name, start, rc=rc)
    return rc


def _report(folder: pathlib.Path, rc: int, out: pathlib.Path) -> None:
    started_file = folder / "started"
    stages = load(folder / "stages.jsonl")
    started = float(started_file.read_text()) if started_file.exists() else min((s.start for s in stages), default=0)
    text = report(stages, test_times(folder), started=started, ended=time.time(), rc=rc)
    out.write_text(text, encoding="utf-8")
    print(f"\n{text}(kept in {out})", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="timeline.py", description=__doc__)
    parser.add_argument("--dir", type=pathlib.Path, default=pathlib.Path(".run/timeline"), help="the run's files")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("begin", help="start a new run (forgets the last one's stages and JUnit files)")
    run = sub.add_parser("stage", help="run a command as a stage: stage NAME -- CMD ...")
    run.add_argument("name")
    run.add_argument("argv", nargs=argparse.REMAINDER)
    rec = sub.add_parser("record", help="record a stage that ran: record NAME START [RC] (epoch seconds)")
    rec.add_argument("name")
    rec.add_argument("start", type=float)
    rec.add_argument("rc", type=int, nargs="?", default=0)
    rep = sub.add_parser("report", help="print the timeline and keep it in --out")
    rep.add_argument("--rc", type=int, default=0, help="the run's exit status")
    rep.add_argument("--out", type=pathlib.Path, default=pathlib.Path(".run/timeline.txt"))
    args = parser.parse_args(argv)
    if args.command == "begin":
        _begin(args.dir)
    elif args.command == "stage":
        return _stage(args.dir, args.name, args.argv[1:] if args.argv[:1] == ["--"] else args.argv)
    elif args.command == "record":
        record(args.name, args.start, rc=args.rc)
    else:
        _report(args.dir, args.rc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
