"""Runs inside a vLLM virtualenv (never imported by the test venv): judges what the operator rendered with vLLM's own
code, so the tests need no vLLM in .venv.

Reads one JSON request on stdin and writes one JSON answer on stdout:

- ``{"op": "check", "cases": [{"name", "argv", "env", "mooncake_config", "triton"}]}``: each argv (what follows
  ``python -m vllm.entrypoints.openai.api_server``) goes through vLLM's FlexibleArgumentParser and make_arg_parser,
  EngineArgs.from_cli_args and create_engine_config (which builds the ECTransferConfig and KVTransferConfig), then
  MooncakeECConfig.from_vllm_config for an ECMooncakeConnector, and the Mooncake JSON file through
  MooncakeStoreConfig.from_file. ``triton``: stand in for the GPU's Triton (vLLM's HAS_TRITON, false on a CPU)
  where a case needs Model Runner V2, which vLLM 0.32 refuses without Triton; on vLLM 0.34, whose CPU platform
  refuses any x86 machine without triton-cpu, for every case (the only stand-in here).
  Answer: ``{"version", "results": [{"name", "ok", "stage", "error"}]}``.
- ``{"op": "spellings", "flags": [...]}``: for each flag, the dest vLLM's parser gives it and every option string
  (and unambiguous abbreviation) that reaches the same dest. Answer: ``{"version", "dests": {flag: dest},
  "spellings": {dest: [...]}}``.

Only stdlib and vLLM; VLLM_TARGET_DEVICE=cpu is set by the caller.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import traceback
from typing import Any

import vllm
import vllm.config.vllm as vllm_config_module
from vllm import triton_utils
from vllm.distributed.ec_transfer.ec_connector.mooncake.config import MooncakeECConfig
from vllm.distributed.mooncake_store import MooncakeStoreConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser

try:  # vLLM 0.33
    from vllm.entrypoints.common.cli_args import make_arg_parser
except ImportError:  # vLLM 0.32
    from vllm.entrypoints.launchers.cli_args import make_arg_parser


def _parser() -> Any:
    return make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))


def _check(parser: Any, case: dict[str, Any]) -> dict[str, Any]:
    stage = "parse"
    saved = dict(os.environ)
    os.environ.update(case.get("env", {}))
    stderr = io.StringIO()
    # Up to 0.33 the config module decides the runner from HAS_TRITON; 0.34 has only Model Runner V2, and its CPU
    # platform refuses an x86 machine without triton-cpu (not on PyPI), which a GPU never lacks.
    stand_in = triton_utils if not hasattr(vllm_config_module, "HAS_TRITON") else vllm_config_module
    has_triton = stand_in.HAS_TRITON
    stand_in.HAS_TRITON = has_triton or bool(case.get("triton")) or stand_in is triton_utils
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser.parse_args(case["argv"])
        stage = "engine_args"
        engine_args = EngineArgs.from_cli_args(args)
        stage = "create_engine_config"
        config = engine_args.create_engine_config()
        ec = config.ec_transfer_config
        if ec is not None and ec.ec_connector == "ECMooncakeConnector":
            stage = "mooncake_ec_config"
            MooncakeECConfig.from_vllm_config(config)
        path = case.get("mooncake_config")
        if path:
            stage = "mooncake_store_config"
            MooncakeStoreConfig.from_file(path)
    except SystemExit as exit_:  # argparse refuses by exiting
        return {"name": case["name"], "ok": False, "stage": stage, "error": f"exit {exit_.code}: {stderr.getvalue()}"}
    except Exception as error:
        tail = traceback.format_exception_only(type(error), error)
        return {"name": case["name"], "ok": False, "stage": stage, "error": "".join(tail).strip()}
    finally:
        stand_in.HAS_TRITON = has_triton
        os.environ.clear()
        os.environ.update(saved)
    return {"name": case["name"], "ok": True, "stage": "done", "error": ""}


def _resolve(parser: Any, option: str) -> argparse.Action | None:
    """The action argparse itself picks for `option` (exact or abbreviated); None when none or ambiguous."""
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            found = parser._parse_optional(option)
        except SystemExit:  # ambiguous abbreviation: argparse refuses it
            return None
    if isinstance(found, list):  # Python 3.12+: a list of candidates
        found = found[0] if len(found) == 1 else None
    if not found:
        return None
    action: argparse.Action | None = found[0]
    return action


def _spellings(parser: Any, flags: list[str]) -> dict[str, Any]:
    table: dict[str, argparse.Action] = dict(parser._option_string_actions)
    dests = {flag: table[flag].dest for flag in flags if flag in table}
    owned = set(dests.values())
    spellings: dict[str, set[str]] = {dest: set() for dest in owned}
    for option, action in table.items():
        if action.dest not in owned:
            continue
        spellings[action.dest].add(option)
        # Every prefix argparse would accept for it (allow_abbrev), asked of the parser itself.
        for end in range(2, len(option)):
            prefix = option[:end]
            if prefix in ("-", "--"):
                continue
            hit = _resolve(parser, prefix)
            if hit is not None and hit.dest == action.dest:
                spellings[action.dest].add(prefix)
    return {"dests": dests, "spellings": {dest: sorted(found) for dest, found in spellings.items()}}


def main() -> int:
    request = json.load(sys.stdin)
    parser = _parser()
    answer: dict[str, Any] = {"version": vllm.__version__}
    if request["op"] == "check":
        answer["results"] = [_check(parser, case) for case in request["cases"]]
    elif request["op"] == "spellings":
        answer.update(_spellings(parser, request["flags"]))
    else:
        raise SystemExit(f"unknown op {request['op']!r}")
    # vLLM logs to stdout; the answer is the last line.
    print("\n" + json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
