"""The `epd-launch` command: the thin shell around `plan_launch` that reads, writes, waits and execs."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from epd_connectors.config.base import ConfigError
from epd_connectors.config.bundle import WORKDIR_ENV, load_bundle
from epd_connectors.config.roles import Role
from epd_connectors.launch import supervise
from epd_connectors.launch.model_check import read_model_config, store_sharing_problem
from epd_connectors.launch.plan import LaunchError, LaunchPlan, plan_launch
from epd_connectors.launch.readiness import DependencyTimeoutError, wait_for_all

DEFAULT_WORKDIR = "/tmp/epd-launch"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="epd-launch",
        description="Start one E/P/D role from its bundle: validate, write files, wait for dependencies, exec.",
    )
    parser.add_argument("role", choices=[r.value for r in Role], help="the role this pod runs")
    parser.add_argument("--bundle", required=True, type=Path, help="path of the role's bundle JSON")
    parser.add_argument(
        "--workdir",
        default=os.environ.get(WORKDIR_ENV, DEFAULT_WORKDIR),
        help=f"where derived files are written (default ${WORKDIR_ENV} or {DEFAULT_WORKDIR})",
    )
    parser.add_argument("--dry-run", action="store_true", help="print argv, env, files and waits as JSON; exit")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    role = Role(args.role)
    started = time.monotonic()

    def say(line: str) -> None:
        print(f"epd-launch[{role.value}]: {line}", file=sys.stderr, flush=True)

    try:
        bundle = load_bundle(args.bundle)
    except ConfigError as exc:
        for problem in exc.problems:
            say(f"invalid bundle: {problem}")
        return 2
    if bundle.role is not role:
        say(
            f"invalid bundle: role = {bundle.role.value!r} but launched as {role.value!r}. "
            "Fix: mount this role's bundle"
        )
        return 2

    workdir = str(Path(args.workdir).absolute())
    try:
        plan = plan_launch(bundle, workdir=workdir, bundle_path=str(args.bundle.absolute()), environ=os.environ)
    except (LaunchError, ConfigError) as exc:
        say(f"cannot start: {exc}")
        return 2
    # The bundle is valid, but the model it points at may defeat what it asks for (model_check).
    config = read_model_config(bundle.vllm.model) if bundle.vllm is not None else None
    mismatch = store_sharing_problem(bundle, config) if config is not None else None
    if mismatch is not None:
        say(f"cannot start: {mismatch}")
        return 1
    if args.dry_run:
        print(json.dumps(_plan_as_dict(plan), indent=2, sort_keys=True))
        return 0

    _write_files(plan)
    try:
        wait_for_all(plan.waits, deadline_s=bundle.wait.deadline_s, interval_s=bundle.wait.interval_s, say=say)
    except DependencyTimeoutError as exc:
        say(str(exc))
        return 1
    return _exec(plan, say, started)


def _plan_as_dict(plan: LaunchPlan) -> dict[str, object]:
    return {
        "argv": plan.argv,
        "env": plan.env,
        "files": plan.files,
        "waits": [{"kind": w.kind, "url": w.url, "description": w.description} for w in plan.waits],
        "supervised": plan.supervised,
    }


def _write_files(plan: LaunchPlan) -> None:
    for path, content in plan.files.items():
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")


def _exec(plan: LaunchPlan, say: Callable[[str], None], started: float) -> int:
    """Replace this process with the role's (or, as PID 1 with a supervised plan, run it as a child); a missing
    binary is a clear one-line failure, not a traceback."""
    executable = shutil.which(plan.argv[0]) or plan.argv[0]
    if not os.path.exists(executable):
        print(
            f"epd-launch: cannot start {plan.argv[0]!r}: not found on PATH. Fix: use the role's image, which ships it",
            file=sys.stderr,
        )
        return 127
    env = {**os.environ, **plan.env}
    command, elapsed = " ".join(plan.argv[:3]), time.monotonic() - started
    if plan.supervised and os.getpid() == 1:
        say(f"run {command} ... as a child (forwarding signals) after {elapsed:.3f}s")
        return supervise.run(executable, plan.argv, env)
    say(f"exec {command} ... after {elapsed:.3f}s")
    sys.stderr.flush()
    os.execve(executable, plan.argv, env)
    return 0  # pragma: no cover - execve does not return


if __name__ == "__main__":
    sys.exit(main())
