"""The operator's proxy settings and the proxy agree: for every consumer Service the rendered proxy watches,
the EC control addresses and bootstrap port it derives for a pod are the ones that Service's own pods listen
on, by their own bundles (TP, DP, ec_port) and the config library's rule (ec_consumer_control_address).

The proxy side is its real watch list (epd_connectors.proxy.static) from the rendered bundle's typed peers; only
the pod address is made up, in an EndpointSlice of the API's shape.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from epd_connectors.config.bundle import RoleBundle, parse_bundle
from epd_connectors.config.ec_transfer import ECMooncakeConsumer, ec_consumer_control_address
from epd_connectors.config.roles import Role
from epd_connectors.proxy.discovery_slices import RoleWatch, specs_from_slices
from epd_connectors.proxy.static import watches_from_peers
from epd_operator.api import constants as c
from epd_operator.api.resource import OperatorDefaults, Owner, parse_spec
from epd_operator.render import render_desired

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
OWNER = Owner(name="demo", namespace="serving", uid="00000000-0000-4000-8000-000000000003")
POD_IP = "10.1.2.3"


def example(name: str) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())["spec"]
    return spec


def pools_swapped() -> dict[str, Any]:
    """The mixed-TP example with the TP 2 pool first: the pairing must follow the pools, not a fixed order."""
    spec = copy.deepcopy(example("e-p-d-store-offload"))
    spec["prefill"]["tensorParallelSize"] = 2
    spec["prefill"]["additionalPools"][0]["tensorParallelSize"] = 1
    return spec


SPECS = {
    "e-p-d-store-offload": example("e-p-d-store-offload"),
    "e-pd-mooncake-cross-encoder": example("e-pd-mooncake-cross-encoder"),
    "pools-swapped": pools_swapped(),
}


def bundles(spec: dict[str, Any]) -> dict[str, RoleBundle]:
    """The rendered bundles by workload (= Service) name."""
    desired = render_desired(OWNER, parse_spec(spec), OperatorDefaults())
    return {
        o["metadata"]["name"].removesuffix("-bundle"): parse_bundle(o["data"][c.BUNDLE_FILE])
        for o in desired.objects
        if o["kind"] == "ConfigMap" and c.BUNDLE_FILE in o.get("data", {})
    }


def proxy_watches(found: dict[str, RoleBundle]) -> list[RoleWatch]:
    proxy = next(b for b in found.values() if b.role is Role.PROXY)
    assert proxy.proxy is not None and proxy.proxy.discover
    return watches_from_peers(proxy.peers)


def a_pod_of(watch: RoleWatch) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{watch.service}-x", "labels": {"kubernetes.io/service-name": watch.service}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [POD_IP], "conditions": {"ready": True}}],
        "ports": [{"name": "http", "port": watch.port}],
    }


@pytest.mark.parametrize("name", sorted(SPECS))
def test_each_consumer_service_is_addressed_as_its_pods_listen(name: str) -> None:
    found = bundles(SPECS[name])
    watches = proxy_watches(found)
    consumer_roles = {Role.PREFILL, Role.PD}
    consumers = {n for n, b in found.items() if b.role in consumer_roles}
    assert {w.service for w in watches if w.ec is not None} == consumers, "every consumer pool is watched"
    assert len(consumers) == len({w.service for w in watches if w.ec is not None})
    for watch in watches:
        own = found[watch.service]
        assert own.vllm is not None and watch.port == own.vllm.port
        if own.role not in consumer_roles:
            assert watch.ec is None
            continue
        ec = own.ec_transfer
        assert isinstance(ec, ECMooncakeConsumer)
        listening = ec.model_copy(update={"ec_ip": POD_IP})
        tp, dp = own.vllm.tensor_parallel_size, own.vllm.data_parallel_size
        assert watch.ec is not None and watch.ec.tensor_parallel_size == tp
        (spec,) = specs_from_slices([a_pod_of(watch)], watch)
        assert spec.ec_addresses == tuple(ec_consumer_control_address(listening, tp, d) for d in range(dp))
        if own.vllm.mooncake_bootstrap_port is not None and own.role is Role.PREFILL:
            assert spec.bootstrap_url == f"http://{POD_IP}:{own.vllm.mooncake_bootstrap_port}"


def test_the_mixed_tp_pools_each_get_their_own_size() -> None:
    for name, want in (("e-p-d-store-offload", [1, 2]), ("pools-swapped", [2, 1])):
        sizes = [w.ec.tensor_parallel_size for w in proxy_watches(bundles(SPECS[name])) if w.ec is not None]
        assert sizes == want, name


def test_the_transfer_check_reaches_the_proxy_as_its_canary_options(tmp_path: Path) -> None:
    """spec.proxy.transferCheck, through the rendered bundle, read by the proxy's own command line."""
    from epd_connectors.proxy.cli import build  # noqa: PLC0415 - the proxy's CLI, only for this test

    spec = copy.deepcopy(example("e-pd-mooncake-cross-encoder"))
    for check, interval, required in (
        ({}, 60.0, True),
        ({"intervalSeconds": 15, "timeoutSeconds": 7, "requiredForReady": False}, 15.0, False),
        ({"enabled": False}, 0.0, False),
    ):
        spec.setdefault("proxy", {})["transferCheck"] = check
        proxy = next(b for b in bundles(spec).values() if b.role is Role.PROXY)
        path = tmp_path / "proxy.json"
        path.write_text(proxy.model_dump_json(by_alias=True))
        app, _, _, _ = build(["--bundle", str(path)], environ={})
        assert app.options.canary.interval_s == interval
        assert app.options.canary.timeout_s == float(check.get("timeoutSeconds", 30))
        derived = render_desired(OWNER, parse_spec(spec), OperatorDefaults()).derived
        assert derived.transfers_required is required
        assert (derived.proxy_health_url is None) == (interval == 0)
