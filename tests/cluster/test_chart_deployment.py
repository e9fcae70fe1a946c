"""`helm install my-model charts/epd-deployment` against the local control plane, with the operator running.

The operator is the tier's usual one (tests/cluster/operator_fixtures.py: a subprocess on loopback watching
the epd-op-* namespaces); the chart only has to produce an EPDDeployment that the API server accepts (schema
and CEL rules) and the operator turns into Ready roles. `helm uninstall` then removes the EPDDeployment.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
from typing import Any

import pytest

from epd_operator.api import constants as c
from epd_testenv import layout
from tests.cluster.operator_fixtures import EPD_PATH, Kube, condition, eventually

pytestmark = pytest.mark.cluster
pytest_plugins = ["tests.cluster.operator_fixtures"]

CHART = layout.repo_root() / "charts" / "epd-deployment"


def helm(kubeconfig: pathlib.Path, tmp: pathlib.Path, *args: str) -> str:
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "HELM_CACHE_HOME": str(tmp / "cache"),
        "HELM_CONFIG_HOME": str(tmp / "config"),
        "HELM_DATA_HOME": str(tmp / "data"),
    }
    done = subprocess.run(
        [str(layout.binary("helm")), *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"helm {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def ready(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        live = kube.epd(ns, name)
        st = live.get("status") or {}
        settled = st.get("observedGeneration") == live["metadata"]["generation"]
        return live if settled and condition(live, c.COND_READY).get("status") == "True" else None

    def detail() -> str:
        st = kube.epd(ns, name).get("status") or {}
        return "\n".join(f"{x['type']}={x['status']} {x['reason']}: {x['message']}" for x in st.get("conditions") or [])

    return eventually(f"{ns}/{name} Ready", probe, detail=detail)


@pytest.mark.parametrize(
    "values",
    [(), ("--set", "store.protocol=tcp", "--set", "encoder.crossEncoderCache.enabled=true")],
    ids=["defaults", "with-store"],
)
@pytest.mark.usefixtures("operator")
def test_helm_install_my_model_becomes_ready(
    kube: Kube,
    kubeconfig: pathlib.Path,
    op_namespace: str,
    tmp_path: pathlib.Path,
    values: tuple[str, ...],
) -> None:
    helm(kubeconfig, tmp_path, "install", "my-model", str(CHART), "-n", op_namespace, *values)
    live = ready(kube, op_namespace, "my-model")
    roles = set(live["status"]["roles"])
    assert {"encoder", "pd", "proxy"} <= roles
    if values:
        assert {"master", "storeClients"} <= roles
    assert live["status"]["endpoint"] == f"http://my-model-proxy.{op_namespace}.svc:8000"

    helm(kubeconfig, tmp_path, "uninstall", "my-model", "-n", op_namespace, "--wait", "--timeout", "60s")
    # The children follow through garbage collection (tested with the operator; its first pass after a new CRD
    # waits for the collector's 30-second discovery resync, so it is not waited for here).
    assert kube.find(EPD_PATH.format(ns=op_namespace) + "/my-model") is None
