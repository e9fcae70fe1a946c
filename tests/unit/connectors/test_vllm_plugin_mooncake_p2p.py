"""The two vLLM plugins MooncakeConnector needs on the CPU build of vLLM 0.32.0, without vLLM: mooncake_cpu_device
(the worker's device index on the CPU platform) and multi_connector_metrics (a MultiConnector's Prometheus metrics
with a connector that has none); the gating (_patching) they share with cpu_amx_tiles, their import hook, their
entry points, and that importing them imports neither vLLM nor torch."""

from __future__ import annotations

import logging
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from epd_connectors.vllm_plugins import _patching, cpu_amx_tiles, mooncake_cpu_device, multi_connector_metrics

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]


# --- gating shared by both ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "release"),
    [("0.32.0", (0, 32, 0)), ("0.32.0+cpu", (0, 32, 0)), ("0.33.0rc1", None), ("0.33", None), ("", None)],
)
def test_release_of_reads_final_releases_only(version: str, release: tuple[int, int, int] | None) -> None:
    assert _patching.release_of(version) == release


KNOWN = frozenset({(0, 32, 0)})


@pytest.mark.parametrize(
    ("version", "value", "applies", "says"),
    [
        ("0.32.0", None, True, "known to have the defect"),
        ("0.32.0+cpu", "auto", True, "known to have the defect"),
        ("0.32.0", "0", False, "disabled by T=0"),
        ("0.32.0", "OFF", False, "disabled by T=OFF"),
        ("0.34.0", None, False, "not a release known"),
        ("0.34.0", "force", True, "forced by T=force"),
        ("0.34.0", "maybe", False, "'maybe' is not one of"),
        ("0.32.0", "maybe", True, "known to have the defect"),
    ],
)
def test_decide(version: str, value: str | None, applies: bool, says: str) -> None:
    environ = {} if value is None else {"T": value}
    decision = _patching.decide(version, environ, "T", KNOWN)
    assert decision.apply is applies
    assert says in decision.reason


def test_the_known_releases_are_the_verified_ones() -> None:
    assert {(0, 32, 0), (0, 33, 0)} == mooncake_cpu_device.KNOWN_DEFECTIVE_RELEASES
    assert {(0, 32, 0), (0, 33, 0)} == cpu_amx_tiles.KNOWN_DEFECTIVE_RELEASES
    assert {(0, 32, 0)} == multi_connector_metrics.KNOWN_DEFECTIVE_RELEASES  # 0.33.0 fixed it itself
    assert mooncake_cpu_device.decide("0.33.0", {}).apply
    assert not multi_connector_metrics.decide("0.33.0", {}).apply


# --- mooncake_cpu_device ------------------------------------------------------------------------------------------


class _NoDriver:
    """torch.accelerator of PyPI's (CUDA) torch on a machine without an NVIDIA driver."""

    def current_device_index(self) -> int:
        raise RuntimeError("Found no NVIDIA driver on your system.")

    def is_available(self) -> bool:
        return False


def connector_module(*, cpu: bool = True, name: str = "fake_mooncake_connector") -> ModuleType:
    module = ModuleType(name)
    module.torch = SimpleNamespace(accelerator=_NoDriver(), Tensor=int, float16="f16")  # type: ignore[attr-defined]
    module.current_platform = SimpleNamespace(is_cpu=lambda: cpu)  # type: ignore[attr-defined]
    module.MooncakeConnectorWorker = type("MooncakeConnectorWorker", (), {})  # type: ignore[attr-defined]
    return module


def test_on_the_cpu_platform_the_connector_sees_device_index_0_and_torch_otherwise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    module = connector_module()
    real = module.torch
    with caplog.at_level(logging.INFO, logger=mooncake_cpu_device.logger.name):
        assert mooncake_cpu_device.patch_connector_module(module)
    assert module.torch.accelerator.current_device_index() == 0
    assert module.torch.accelerator.is_available() is False
    assert module.torch.Tensor is int and module.torch.float16 == "f16"
    real.float16 = "changed later"
    assert module.torch.float16 == "changed later", "attributes are looked up on torch, never copied"
    assert [r.message for r in caplog.records if "on the CPU platform" in r.message], caplog.text


def test_patching_twice_wraps_once() -> None:
    module = connector_module()
    assert mooncake_cpu_device.patch_connector_module(module)
    stand_in = module.torch
    assert mooncake_cpu_device.patch_connector_module(module)
    assert module.torch is stand_in


def test_another_platform_is_left_alone() -> None:
    module = connector_module(cpu=False)
    real = module.torch
    assert not mooncake_cpu_device.patch_connector_module(module)
    assert module.torch is real
    with pytest.raises(RuntimeError, match="NVIDIA"):
        module.torch.accelerator.current_device_index()


def test_a_module_it_was_not_written_for_is_left_alone_and_nothing_raises() -> None:
    module = connector_module()
    del module.MooncakeConnectorWorker
    assert not mooncake_cpu_device.patch_connector_module(module)
    broken = connector_module()
    broken.current_platform = SimpleNamespace(is_cpu=lambda: 1 / 0)  # type: ignore[attr-defined]
    assert not mooncake_cpu_device.patch_connector_module(broken)


# --- multi_connector_metrics --------------------------------------------------------------------------------------


def metrics_module(name: str = "fake_multi_connector") -> ModuleType:
    """vLLM 0.32.0's MultiKVConnectorPromMetrics.observe, reduced to its assertion."""
    module = ModuleType(name)

    class MultiKVConnectorPromMetrics:
        def __init__(self, registered: dict[str, Any]) -> None:
            self._prom_metrics = registered
            self.seen: list[tuple[dict[str, Any], int]] = []

        def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
            for connector_id in transfer_stats_data:
                assert connector_id in self._prom_metrics, f"{connector_id} is not contained"
            self.seen.append((transfer_stats_data, engine_idx))

    module.MultiKVConnectorPromMetrics = MultiKVConnectorPromMetrics  # type: ignore[attr-defined]
    return module


def test_unpatched_the_assertion_fires_as_in_vllm() -> None:
    metrics = metrics_module().MultiKVConnectorPromMetrics({"MooncakeStoreConnector": object()})
    with pytest.raises(AssertionError, match="MooncakeConnector"):
        metrics.observe({"MooncakeConnector": {}, "MooncakeStoreConnector": {}})


def test_patched_the_stats_of_a_connector_without_metrics_are_skipped() -> None:
    module = metrics_module()
    assert multi_connector_metrics.patch_metrics_module(module)
    assert multi_connector_metrics.patch_metrics_module(module), "a second patch is a no-op"
    metrics = module.MultiKVConnectorPromMetrics({"MooncakeStoreConnector": object()})
    metrics.observe({"MooncakeConnector": {"n": 1}, "MooncakeStoreConnector": {"n": 2}}, 3)
    assert metrics.seen == [({"MooncakeStoreConnector": {"n": 2}}, 3)]
    observe = module.MultiKVConnectorPromMetrics.observe
    assert getattr(observe, multi_connector_metrics.PATCHED_ATTRIBUTE)
    assert getattr(observe.__wrapped__, multi_connector_metrics.PATCHED_ATTRIBUTE, False) is False


def test_registered_only_leaves_what_it_cannot_read_to_vllm() -> None:
    assert multi_connector_metrics.registered_only({"a": 1, "b": 2}, {"b": 0}) == {"b": 2}
    assert multi_connector_metrics.registered_only(["a"], {"b": 0}) == ["a"]
    assert multi_connector_metrics.registered_only({"a": 1}, None) == {"a": 1}


def test_a_metrics_module_without_the_class_is_left_alone() -> None:
    assert not multi_connector_metrics.patch_metrics_module(ModuleType("empty"))


# --- the import hook and register() -------------------------------------------------------------------------------


def test_the_import_hook_patches_the_module_when_vllm_imports_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "fakevllm_kv"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mooncake_connector.py").write_text(
        "from types import SimpleNamespace\n"
        "class _NoDriver:\n"
        "    def current_device_index(self):\n"
        "        raise RuntimeError('Found no NVIDIA driver on your system.')\n"
        "torch = SimpleNamespace(accelerator=_NoDriver())\n"
        "current_platform = SimpleNamespace(is_cpu=lambda: True)\n"
        "class MooncakeConnectorWorker:\n"
        "    def __init__(self):\n"
        "        self.device_id = torch.accelerator.current_device_index()\n"
    )
    name = "fakevllm_kv.mooncake_connector"
    monkeypatch.syspath_prepend(str(tmp_path))
    before = list(sys.meta_path)
    try:
        _patching.arm(name, mooncake_cpu_device.patch_connector_module)
        _patching.arm(name, mooncake_cpu_device.patch_connector_module)
        assert len([f for f in sys.meta_path if isinstance(f, _patching.PatchOnImport)]) == 1, "one hook"
        module = __import__(name, fromlist=["MooncakeConnectorWorker"])
        assert module.MooncakeConnectorWorker().device_id == 0
        assert not [f for f in sys.meta_path if isinstance(f, _patching.PatchOnImport)], "the hook removed itself"
    finally:
        sys.meta_path[:] = before
        for loaded in [m for m in sys.modules if m.split(".")[0] == "fakevllm_kv"]:
            del sys.modules[loaded]


def test_arm_patches_at_once_when_the_module_is_already_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    module = metrics_module("fake_loaded_multi_connector")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    before = list(sys.meta_path)
    _patching.arm(module.__name__, multi_connector_metrics.patch_metrics_module)
    assert sys.meta_path == before
    assert getattr(module.MultiKVConnectorPromMetrics.observe, multi_connector_metrics.PATCHED_ATTRIBUTE)


PLUGINS: list[Any] = [mooncake_cpu_device, multi_connector_metrics, cpu_amx_tiles]


@pytest.mark.parametrize("plugin", PLUGINS, ids=lambda p: p.__name__.rsplit(".", 1)[-1])
@pytest.mark.parametrize(("version", "value", "armed"), [("0.32.0", None, True), ("0.32.0", "0", False)])
def test_register_arms_only_when_the_decision_applies(
    monkeypatch: pytest.MonkeyPatch, plugin: Any, version: str, value: str | None, armed: bool
) -> None:
    fake_vllm = ModuleType("vllm")
    fake_vllm.__version__ = version  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm)
    monkeypatch.delenv(plugin.TOGGLE_ENV, raising=False)
    if value is not None:
        monkeypatch.setenv(plugin.TOGGLE_ENV, value)
    calls: list[str] = []
    monkeypatch.setattr(_patching, "arm", lambda name, patch: calls.append(name))
    plugin.register()
    assert bool(calls) is armed


@pytest.mark.parametrize("plugin", PLUGINS, ids=lambda p: p.__name__.rsplit(".", 1)[-1])
def test_register_without_vllm_only_logs(monkeypatch: pytest.MonkeyPatch, plugin: Any) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    before = list(sys.meta_path)
    plugin.register()
    assert sys.meta_path == before


# --- packaging ----------------------------------------------------------------------------------------------------


def test_the_entry_points_name_register() -> None:
    project = tomllib.loads((REPO / "connectors" / "pyproject.toml").read_text())
    plugins = project["project"]["entry-points"]["vllm.general_plugins"]
    for plugin in PLUGINS:
        assert plugins[plugin.ENTRY_POINT] == f"{plugin.__name__}:register"


def test_importing_the_plugins_imports_no_vllm_or_torch() -> None:
    code = (
        "import sys, epd_connectors.vllm_plugins.mooncake_cpu_device, "
        "epd_connectors.vllm_plugins.multi_connector_metrics, epd_connectors.vllm_plugins.cpu_amx_tiles\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.strip() == "[]"
