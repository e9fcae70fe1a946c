"""`python -m epd_local`: run an EPDDeployment on this machine, or show what running it would do.

    python -m epd_local plan examples/local-e-pd.yaml --model DIR
    python -m epd_local run  examples/local-e-pd.yaml --model DIR --python .venv-e2e/bin/python

`run` prints the local profile's changes and the address plan, starts every role through epd-launch, prints
progress until all are ready, then the proxy URL and a curl line (and with --sample-request the answer to a
sample request), and serves until Ctrl-C (or, with --once, stops right away). Any failure is one line, with
the tail of the culprit's log; SIGINT and SIGTERM stop everything it started.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from epd_local import plan as local_plan
from epd_local import processes, profile, sample


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="epd-local", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name, what in (("run", "start every role and serve until Ctrl-C"), ("plan", "print the plan; start nothing")):
        c = sub.add_parser(name, help=what)
        c.add_argument("manifest", type=Path, help="an EPDDeployment YAML")
        c.add_argument("--model", type=Path, help="folder of the weights (the pods' model volume)")
        c.add_argument("--workdir", type=Path, help="logs, bundles and shared folders (default: a new temp dir)")
        c.add_argument("--base-port", type=int, help="first port of the address plan (default: random, free)")
        c.add_argument("--no-profile", action="store_true", help="render the spec as written (no CPU profile)")
        c.add_argument("--roles", help="only these roles, comma-separated (e.g. master,store-client)")
    run = sub.choices["run"]
    run.add_argument("--python", type=Path, default=Path(sys.executable), help="interpreter of epd-launch and vLLM")
    run.add_argument("--sample-request", action="store_true", help="send a sample request once ready, print it")
    run.add_argument("--once", action="store_true", help="stop everything once ready (after the sample request)")
    run.add_argument("--deadline", type=float, default=processes.DEFAULT_START_DEADLINE_S, help="seconds to start")
    return p


def say(line: str) -> None:
    print(f"epd-local: {line}", flush=True)


def print_plan(plan: local_plan.LocalPlan, only: set[str] | None) -> None:
    if plan.profile_changes:
        say("local profile (CPU-only machine; --no-profile to skip):")
        for change in plan.profile_changes:
            print(f"    {change}", flush=True)
    say(f"address plan of {plan.deployment} (127.0.0.1):")
    for instance in plan.instances:
        if only is None or instance.role.value in only:
            ports = " ".join(f"{name}={port}" for name, port in instance.ports.items())
            print(f"    {instance.name:<32} {instance.role.value:<13} {ports}", flush=True)


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    only = set(args.roles.split(",")) if args.roles else None
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="epd-local-"))).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    model = args.model.absolute() if args.model else Path("/models")
    chosen = profile.NONE if args.no_profile else profile.CPU
    plan = processes.plan_on_free_ports(args.manifest, workdir, model, chosen, args.base_port)
    print_plan(plan, only)
    if args.command == "plan":
        return 0
    needs_model = any(i.bundle.vllm is not None for i in plan.instances if only is None or i.role.value in only)
    if needs_model and args.model is None:
        say("--model DIR is required to start vLLM roles (`make demo-local` builds the tiny test model)")
        return 2
    say(f"work directory {workdir}")
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    started = time.monotonic()
    try:
        with processes.deployment(
            plan, workdir, args.python.absolute(), say=say, only=only, deadline_s=args.deadline
        ) as local:
            say(f"all {len(local.running)} ready after {time.monotonic() - started:.0f}s")
            has_proxy = any(r.instance.role.value == "proxy" for r in local.running)
            if has_proxy:
                say(f"proxy: {plan.endpoint}")
                say(f"try:   {sample.curl_line(plan.endpoint, plan.served_model)}")
            if has_proxy and args.sample_request:
                body = sample.chat_body(plan.served_model)
                answer = sample.ask(plan.endpoint, body)
                say(f"sample request (one 64x64 image + {sample.SAMPLE_PROMPT!r}, greedy, 16 tokens) answered:")
                print(f"    {sample.answer_text(answer)!r}", flush=True)
            if args.once:
                return 0
            say("serving; Ctrl-C stops everything")
            while not (failed := local.failed()):
                time.sleep(1)
            culprit, why = failed[0]
            say(f"{culprit.describe_failure(why)}; stopping all. The end of its log:")
            print(culprit.tail(), flush=True)
            return 1
    except processes.StartError as exc:
        say(f"error: {exc}")
        print(exc.log_tail, flush=True)
        return 1
    except RuntimeError as exc:
        say(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        say("interrupted; everything it started is stopped")
        return 130


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return run(args)
    except local_plan.LocalPlanError as exc:
        for problem in exc.problems:
            say(f"error: {problem}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
