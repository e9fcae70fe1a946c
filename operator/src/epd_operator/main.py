"""`epd-operator`: parse the settings, start the metrics server, run kopf with our handlers and settings.

Peering is off unless a name is given (one replica needs no coordination, and peering needs kopf's peering
CRDs); kopf serves the liveness endpoint; nothing here adds a finalizer (see handlers).
"""

from __future__ import annotations

import sys

# kopf imports the Kubernetes client library's models wherever that library is installed (beside the tests, not
# in the operator image), only to recognise them in handlers' answers; ours are plain dicts. Blocked, it costs
# nothing (a third of the operator's memory otherwise). This module is only ever a process's entry point.
sys.modules.setdefault("kubernetes", None)  # type: ignore[arg-type]

import logging  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
from collections.abc import Sequence  # noqa: E402

import kopf  # noqa: E402

from epd_operator import handlers  # noqa: E402
from epd_operator.metrics import Metrics  # noqa: E402
from epd_operator.settings import Settings, SettingsError, parse  # noqa: E402


def kopf_settings() -> kopf.OperatorSettings:
    """kopf's OperatorSettings for ours; the peering is kopf.run's arguments (it sets them on these)."""
    configured = kopf.OperatorSettings()
    handlers.configure(configured)
    return configured


PRIORITIES = (1, 2**31 - 1)
"""The range a replica's peering priority is drawn from (two draws meet about once in two billion)."""


def peering_priority(settings: Settings, draw: random.Random) -> int:
    """The given priority, else a random one: the chart's replicas run the same arguments, and kopf pauses every
    replica while two have the same priority."""
    return settings.priority if settings.priority is not None else draw.randint(*PRIORITIES)


def run(settings: Settings) -> None:
    """Run until SIGTERM/SIGINT."""
    kopf.configure(verbose=settings.verbose, debug=settings.debug)
    if not (settings.verbose or settings.debug):
        # kopf logs every handler success at INFO: one line per workload event. Keep its warnings and errors.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # liveness probes
    metrics = Metrics()
    if settings.metrics_port:
        metrics.serve(settings.metrics_port, settings.metrics_host)
    memo = kopf.Memo()
    memo.settings, memo.metrics = settings, metrics
    kopf.run(
        registry=handlers.registry(peering=settings.peering is not None),
        settings=kopf_settings(),
        standalone=settings.peering is None,
        peering_name=settings.peering,
        priority=peering_priority(settings, random.Random()),
        clusterwide=settings.all_namespaces,
        namespaces=settings.namespaces,
        liveness_endpoint=settings.liveness,
        memo=memo,
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = parse(argv, os.environ)
    except SettingsError as exc:
        print(f"epd-operator: {exc}", file=sys.stderr)
        return 2
    run(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
