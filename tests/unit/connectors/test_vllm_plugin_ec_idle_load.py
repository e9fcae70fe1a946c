"""The ec_idle_load vLLM plugin's gating, without vLLM: which versions and environments it patches, on which
steps its wrapper runs the EC connector section, how its import hook patches a runner module, and that
importing it never imports vLLM."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from epd_connectors.config.bundle import RoleBundle
from epd_connectors.config.ec_transfer import ECMooncakeConsumer
from epd_connectors.config.roles import Role
from epd_connectors.config.vllm import VllmServerConfig
from epd_connectors.launch.plan import plan_launch
from epd_connectors.vllm_plugins import _patching
from epd_connectors.vllm_plugins import ec_idle_load as plugin
from epd_connectors.vllm_plugins._patching import release_of
from epd_connectors.vllm_plugins.ec_idle_load import (
    KNOWN_BUGGY_RELEASES,
    TOGGLE_ENV,
    V2_RUNNER_ENV,
    _VllmParts,
    _wrap,
    decide,
    should_run_idle_ec_section,
    v2_runner_requested,
)

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]


# --- which vLLM and which environment ---------------------------------------------------------------------------


def test_the_known_buggy_releases_are_the_verified_ones() -> None:
    assert {(0, 30, 0), (0, 31, 0), (0, 32, 0), (0, 33, 0)} == KNOWN_BUGGY_RELEASES


@pytest.mark.parametrize(
    ("version", "release"),
    [
        ("0.32.0", (0, 32, 0)),
        ("0.33.0", (0, 33, 0)),
        ("0.33.0+cpu", (0, 33, 0)),
        (" 0.32.0 ", (0, 32, 0)),
        ("0.33.0rc1", None),
        ("0.33.1.dev12+gabc", None),
        ("0.33", None),
        ("unknown", None),
        ("", None),
    ],
)
def test_release_of_reads_final_releases_only(version: str, release: tuple[int, int, int] | None) -> None:
    assert release_of(version) == release


@pytest.mark.parametrize("version", ["0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.33.0+cpu"])
def test_applies_to_a_known_buggy_release_by_default(version: str) -> None:
    decision = decide(version, {})
    assert decision.apply
    assert version in decision.reason


@pytest.mark.parametrize("version", ["0.29.0", "0.32.1", "0.34.0", "0.33.0rc1", "0.33.1.dev3", "unknown"])
def test_does_not_apply_to_other_versions(version: str) -> None:
    decision = decide(version, {})
    assert not decision.apply
    assert "not a release known to have the defect" in decision.reason


@pytest.mark.parametrize("value", ["0", "off", "OFF", "false", "no", "disable", " 0 "])
def test_the_env_var_disables_it_even_on_a_buggy_release(value: str) -> None:
    decision = decide("0.33.0", {TOGGLE_ENV: value})
    assert not decision.apply
    assert "disabled by" in decision.reason


@pytest.mark.parametrize("value", ["1", "on", "auto", "true", "yes", ""])
def test_auto_values_keep_the_version_rule(value: str) -> None:
    assert decide("0.32.0", {TOGGLE_ENV: value}).apply
    assert not decide("0.34.0", {TOGGLE_ENV: value}).apply


def test_force_applies_to_an_unknown_version_but_never_under_the_v2_runner() -> None:
    assert decide("0.34.0", {TOGGLE_ENV: "force"}).apply
    assert not decide("0.34.0", {TOGGLE_ENV: "force", V2_RUNNER_ENV: "1"}).apply


@pytest.mark.parametrize(("value", "applies"), [("1", False), ("2", False), ("x", False), ("0", True)])
def test_the_v2_runner_switch(value: str, applies: bool) -> None:
    """V2 selected (or a value vLLM cannot read): nothing is patched; V1 forced with 0: patched."""
    decision = decide("0.33.0", {V2_RUNNER_ENV: value})
    assert decision.apply is applies
    if not applies:
        assert V2_RUNNER_ENV in decision.reason


def test_v2_runner_requested_reads_like_vllm() -> None:
    assert v2_runner_requested(None) is None
    assert v2_runner_requested("1") is True
    assert v2_runner_requested("0") is False
    assert v2_runner_requested("yes") is True  # vLLM would fail on it; never patch then


# --- on which steps the wrapper runs the EC section ------------------------------------------------------------

IDLE_CONSUMER_STEP: dict[str, Any] = {
    "scheduled_tokens": 0,
    "has_ec_metadata": True,
    "has_ec_connector": True,
    "connector_is_consumer": True,
    "runner_runs_ec_section": True,
    "ec_output_present": False,
}


def test_an_idle_consumer_step_runs_the_section() -> None:
    assert should_run_idle_ec_section(**IDLE_CONSUMER_STEP)


@pytest.mark.parametrize(
    ("field_name", "value"),
    [
        ("scheduled_tokens", 1),  # vLLM ran the section itself
        ("has_ec_metadata", False),  # nothing to bind
        ("has_ec_connector", False),  # no EC transfer configured
        ("connector_is_consumer", False),  # a producer's section runs before the early return
        ("runner_runs_ec_section", False),  # text-only model, later pipeline rank, encoder-decoder
        ("ec_output_present", True),  # a fixed vLLM already ran it: never twice
    ],
)
def test_any_other_step_is_left_alone(field_name: str, value: object) -> None:
    assert not should_run_idle_ec_section(**{**IDLE_CONSUMER_STEP, field_name: value})


# --- the wrapper against stand-ins for vLLM's runner and connector ----------------------------------------------


class FakeOutput:
    """Stands in for vLLM's ModelRunnerOutput (with_ec_conn_output returns a copy carrying the EC output)."""

    def __init__(self, ec_connector_output: object = None) -> None:
        self.ec_connector_output = ec_connector_output

    @staticmethod
    def with_ec_conn_output(output: FakeOutput, ec_output: object) -> FakeOutput:
        return FakeOutput(ec_output)


EMPTY = FakeOutput()


@dataclass
class FakeConnector:
    is_consumer: bool = True


@dataclass
class FakeStep:
    total_num_scheduled_tokens: int = 0
    ec_connector_metadata: object | None = "meta"


@dataclass
class FakeRunner:
    supports_mm_inputs: bool = True
    encoder_cache: dict[str, Any] = field(default_factory=dict)
    sections: list[object] = field(default_factory=list)
    returns: object = EMPTY

    def execute_model(self, scheduler_output: FakeStep, intermediate_tensors: object = None) -> object:
        return self.returns

    def maybe_get_ec_connector_output(self, scheduler_output: FakeStep, **kwargs: Any) -> AbstractContextManager[str]:
        self.sections.append(scheduler_output.ec_connector_metadata)
        assert kwargs == {"encoder_cache": self.encoder_cache}
        return nullcontext("ec-output")


@dataclass
class FakePP:
    is_first_rank: bool = True


def parts(connector: FakeConnector | None = None, first_rank: bool = True) -> _VllmParts:
    return _VllmParts(
        has_ec_transfer=lambda: connector is not None,
        get_ec_transfer=lambda: connector,
        get_pp_group=lambda: FakePP(first_rank),
        model_runner_output=FakeOutput,
        inference_mode=nullcontext,
    )


def test_the_wrapper_runs_the_section_on_an_idle_consumer_step_and_attaches_its_output() -> None:
    runner = FakeRunner()
    wrapped = _wrap(FakeRunner.execute_model, parts(FakeConnector()))
    output = wrapped(runner, FakeStep())
    assert runner.sections == ["meta"]
    assert isinstance(output, FakeOutput) and output.ec_connector_output == "ec-output"
    assert EMPTY.ec_connector_output is None, "the shared empty output must not be written to"


@pytest.mark.parametrize(
    ("step", "connector", "runner", "first_rank"),
    [
        (FakeStep(total_num_scheduled_tokens=5), FakeConnector(), FakeRunner(), True),
        (FakeStep(ec_connector_metadata=None), FakeConnector(), FakeRunner(), True),
        (FakeStep(), None, FakeRunner(), True),
        (FakeStep(), FakeConnector(is_consumer=False), FakeRunner(), True),
        (FakeStep(), FakeConnector(), FakeRunner(supports_mm_inputs=False), True),
        (FakeStep(), FakeConnector(), FakeRunner(), False),
        (FakeStep(), FakeConnector(), FakeRunner(returns=FakeOutput("already")), True),
        (FakeStep(), FakeConnector(), FakeRunner(returns="intermediate tensors"), True),
    ],
    ids=[
        "tokens",
        "no-metadata",
        "no-connector",
        "producer",
        "text-only",
        "later-pp-rank",
        "already-ran",
        "not-output",
    ],
)
def test_the_wrapper_returns_vllms_output_untouched_otherwise(
    step: FakeStep, connector: FakeConnector | None, runner: FakeRunner, first_rank: bool
) -> None:
    wrapped = _wrap(FakeRunner.execute_model, parts(connector, first_rank))
    assert wrapped(runner, step) is runner.returns
    assert runner.sections == []


def test_the_wrapper_is_marked_and_keeps_the_original() -> None:
    wrapped = _wrap(FakeRunner.execute_model, parts(FakeConnector()))
    assert getattr(wrapped, plugin.PATCHED_ATTRIBUTE) is True
    assert wrapped.__wrapped__ is FakeRunner.execute_model  # type: ignore[attr-defined]
    assert wrapped.__name__ == "execute_model"


# --- patching a runner module and the import hook ---------------------------------------------------------------


@pytest.fixture
def fake_parts(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(plugin, "_vllm_parts", lambda: parts(FakeConnector()))
    yield


def runner_module(name: str = plugin.RUNNER_MODULE) -> ModuleType:
    """A module holding a GPUModelRunner class with the two methods the wrapper needs (and nothing inherited)."""
    module = ModuleType(name)
    methods: dict[str, Any] = {
        "execute_model": FakeRunner.execute_model,
        "maybe_get_ec_connector_output": FakeRunner.maybe_get_ec_connector_output,
    }
    module.GPUModelRunner = type("GPUModelRunner", (), methods)  # type: ignore[attr-defined]
    return module


@pytest.mark.usefixtures("fake_parts")
def test_patch_runner_module_wraps_once() -> None:
    module = runner_module()
    assert plugin.patch_runner_module(module)
    wrapped = module.GPUModelRunner.execute_model
    assert getattr(wrapped, plugin.PATCHED_ATTRIBUTE)
    assert plugin.patch_runner_module(module)
    assert module.GPUModelRunner.execute_model is wrapped


@pytest.mark.usefixtures("fake_parts")
def test_patch_runner_module_refuses_a_module_it_was_not_written_for() -> None:
    assert not plugin.patch_runner_module(ModuleType(plugin.RUNNER_MODULE))
    module = runner_module()
    del module.GPUModelRunner.maybe_get_ec_connector_output
    original = module.GPUModelRunner.execute_model
    assert not plugin.patch_runner_module(module)
    assert module.GPUModelRunner.execute_model is original


def test_patch_runner_module_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> _VllmParts:
        raise ImportError("no vllm here")

    monkeypatch.setattr(plugin, "_vllm_parts", broken)
    assert not plugin.patch_runner_module(runner_module())


@pytest.mark.usefixtures("fake_parts")
def test_the_import_hook_patches_the_runner_when_it_is_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package laid out like vLLM's runner module, imported after arm(): patched on import, hook removed."""
    package = tmp_path / "fakevllm" / "v1" / "worker"
    package.mkdir(parents=True)
    for folder in (tmp_path / "fakevllm", tmp_path / "fakevllm" / "v1", package):
        (folder / "__init__.py").write_text("")
    (package / "gpu_model_runner.py").write_text(
        "class GPUModelRunner:\n"
        "    def execute_model(self, scheduler_output, intermediate_tensors=None):\n"
        "        return None\n"
        "    def maybe_get_ec_connector_output(self, scheduler_output, **kwargs):\n"
        "        return None\n"
    )
    name = "fakevllm.v1.worker.gpu_model_runner"
    monkeypatch.syspath_prepend(str(tmp_path))
    before = list(sys.meta_path)
    try:
        _patching.arm(name, plugin.patch_runner_module)
        _patching.arm(name, plugin.patch_runner_module)
        hooks = [f for f in sys.meta_path if isinstance(f, _patching.PatchOnImport)]
        assert len(hooks) == 1, "arming twice installs one hook"
        module = __import__(name, fromlist=["GPUModelRunner"])
        assert getattr(module.GPUModelRunner.execute_model, plugin.PATCHED_ATTRIBUTE, False)
        assert not [f for f in sys.meta_path if isinstance(f, _patching.PatchOnImport)], "the hook removes itself"
    finally:
        sys.meta_path[:] = before
        for loaded in [m for m in sys.modules if m == "fakevllm" or m.startswith("fakevllm.")]:
            del sys.modules[loaded]


@pytest.mark.usefixtures("fake_parts")
def test_arm_patches_at_once_when_the_runner_is_already_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    module = runner_module("fakevllm_loaded.gpu_model_runner")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    before = list(sys.meta_path)
    _patching.arm(module.__name__, plugin.patch_runner_module)
    assert sys.meta_path == before
    assert getattr(module.GPUModelRunner.execute_model, plugin.PATCHED_ATTRIBUTE, False)


def test_register_without_vllm_logs_and_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin must never stop vLLM from starting: any failure is a warning."""
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    before = list(sys.meta_path)
    plugin.register()
    assert sys.meta_path == before


@pytest.mark.parametrize(
    ("version", "environ", "armed"),
    [("0.33.0", {}, True), ("0.33.0", {TOGGLE_ENV: "0"}, False), ("0.33.0", {V2_RUNNER_ENV: "1"}, False)],
)
def test_register_arms_only_when_the_decision_applies(
    monkeypatch: pytest.MonkeyPatch, version: str, environ: dict[str, str], armed: bool
) -> None:
    fake_vllm = ModuleType("vllm")
    fake_vllm.__version__ = version  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm)
    for key in (TOGGLE_ENV, V2_RUNNER_ENV):
        monkeypatch.delenv(key, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    calls: list[str] = []
    monkeypatch.setattr(_patching, "arm", lambda name, patch: calls.append(name))
    plugin.register()
    assert bool(calls) is armed


# --- packaging: the entry point, and no vLLM at import time -----------------------------------------------------


def test_the_entry_point_names_register() -> None:
    project = tomllib.loads((REPO / "connectors" / "pyproject.toml").read_text())
    plugins = project["project"]["entry-points"]["vllm.general_plugins"]
    assert plugins[plugin.ENTRY_POINT] == "epd_connectors.vllm_plugins.ec_idle_load:register"


def test_importing_the_plugin_imports_no_vllm_or_torch() -> None:
    code = (
        "import sys, epd_connectors, epd_connectors.vllm_plugins.ec_idle_load\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.strip() == "[]"


# --- the toggle reaches the process through the bundle ----------------------------------------------------------


def test_a_bundles_env_carries_the_toggle_and_the_host_ip_into_the_launch_plan() -> None:
    bundle = RoleBundle(
        deployment="d",
        role=Role.PD,
        vllm=VllmServerConfig(role="pd", model="/m"),
        ec_transfer=ECMooncakeConsumer(ec_buffer_device="cpu", ec_ip="10.0.0.7"),
        env={TOGGLE_ENV: "0"},
    )
    plan = plan_launch(bundle, workdir="/w", bundle_path="/w/b.json", environ={"POD_IP": "10.0.0.7"})
    assert plan.env[TOGGLE_ENV] == "0"
    assert plan.env["VLLM_HOST_IP"] == "10.0.0.7"
