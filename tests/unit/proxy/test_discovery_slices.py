"""EndpointSlices to instances: readiness, ports, EC and bootstrap addresses, watch events
(epd_connectors.proxy.discovery_slices; the watching itself needs a cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from epd_connectors.config.bundle import ECControl
from epd_connectors.config.roles import Role
from epd_connectors.proxy.discovery_slices import RoleWatch, apply_event, specs_from_slices
from epd_connectors.proxy.roster import InstanceSpec

pytestmark = pytest.mark.unit


def endpoint(address: str, ready: bool | None = True, terminating: bool = False) -> dict[str, Any]:
    conditions: dict[str, Any] = {"terminating": terminating}
    if ready is not None:
        conditions["ready"] = ready
    return {"addresses": [address], "conditions": conditions}


def slice_(
    name: str, *endpoints: dict[str, Any], service: str = "demo-pd", ports: Any = None, family: str = "IPv4"
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
        "addressType": family,
        "endpoints": list(endpoints),
        "ports": ports if ports is not None else [{"name": "http", "port": 8000, "protocol": "TCP"}],
    }


def test_ready_and_unknown_endpoints_count_not_ready_or_terminating_ones() -> None:
    watch = RoleWatch(Role.PD, "demo-pd")
    slices = [
        slice_("a", endpoint("10.0.0.2"), endpoint("10.0.0.3", ready=False)),
        slice_("b", endpoint("10.0.0.1", ready=None), endpoint("10.0.0.4", terminating=True)),
    ]
    assert [s.url for s in specs_from_slices(slices, watch)] == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]


def test_port_by_name_then_number_then_the_only_one() -> None:
    ports = [{"name": "metrics", "port": 9000}, {"name": "http", "port": 8000}]
    one = [slice_("a", endpoint("10.0.0.1"), ports=ports)]
    assert specs_from_slices(one, RoleWatch(Role.PD, "demo-pd", port_name="http"))[0].url.endswith(":8000")
    assert specs_from_slices(one, RoleWatch(Role.PD, "demo-pd", port=8000))[0].url.endswith(":8000")
    assert specs_from_slices(one, RoleWatch(Role.PD, "demo-pd"))[0].url.endswith(":9000")
    assert specs_from_slices(one, RoleWatch(Role.PD, "demo-pd", port_name="grpc")) == []


def test_discovered_consumer_addresses_follow_vllms_port_layout() -> None:
    """TP rank 0 of DP replica d listens on ec_port + d*tp."""
    assert ECControl(port=14579, tensor_parallel_size=2, data_parallel_size=3).addresses("10.0.0.7") == [
        "tcp://10.0.0.7:14579",
        "tcp://10.0.0.7:14581",
        "tcp://10.0.0.7:14583",
    ]
    assert ECControl(port=14579).addresses("fd00::7") == ["tcp://[fd00::7]:14579"]


def test_consumers_get_ec_addresses_per_dp_replica_and_prefill_a_bootstrap_address() -> None:
    watch = RoleWatch(
        Role.PREFILL,
        "demo-prefill",
        ec=ECControl(port=14579, tensor_parallel_size=2, data_parallel_size=2),
        bootstrap_port=8998,
    )
    specs = specs_from_slices([slice_("a", endpoint("10.0.0.9"), service="demo-prefill")], watch)
    assert specs == [
        InstanceSpec("http://10.0.0.9:8000", ("tcp://10.0.0.9:14579", "tcp://10.0.0.9:14581"), "http://10.0.0.9:8998")
    ]


def test_ipv6_other_services_and_fqdn_slices() -> None:
    watch = RoleWatch(Role.PD, "demo-pd")
    slices = [
        slice_("v6", endpoint("fd00::1"), family="IPv6"),
        slice_("other", endpoint("10.9.9.9"), service="someone-else"),
        slice_("fqdn", endpoint("pd.example"), family="FQDN"),
    ]
    assert [s.url for s in specs_from_slices(slices, watch)] == ["http://[fd00::1]:8000"]


def test_watch_events_keep_the_slice_set_current() -> None:
    slices: dict[str, Any] = {}
    apply_event(slices, "ADDED", slice_("a", endpoint("10.0.0.1")))
    apply_event(slices, "ADDED", slice_("b", endpoint("10.0.0.2")))
    apply_event(slices, "MODIFIED", slice_("a", endpoint("10.0.0.3")))
    apply_event(slices, "DELETED", slice_("b"))
    apply_event(slices, "BOOKMARK", slice_("c", endpoint("10.0.0.4")))
    urls = [s.url for s in specs_from_slices(slices.values(), RoleWatch(Role.PD, "demo-pd"))]
    assert urls == ["http://10.0.0.3:8000"]
