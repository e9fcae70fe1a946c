"""Every address the library writes from a host and a port brackets an IPv6 literal, as URLs and ZMQ need."""

from __future__ import annotations

import pytest

from epd_connectors.config.base import address
from epd_connectors.config.bundle import Endpoint
from epd_connectors.config.ec_ports import ec_control_address

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("host", "want"),
    [
        ("10.0.0.7", "http://10.0.0.7:8000"),
        ("fd00::7", "http://[fd00::7]:8000"),
        ("[fd00::7]", "http://[fd00::7]:8000"),
        ("prefill-0.prefill.ns.svc", "http://prefill-0.prefill.ns.svc:8000"),
    ],
)
def test_a_host_and_a_port_make_one_address(host: str, want: str) -> None:
    assert address("http", host, 8000) == want
    assert Endpoint(host=host, port=8000).url() == want


def test_an_ipv6_consumer_gets_a_bracketed_ec_control_address() -> None:
    assert ec_control_address("fd00::7", 30000, 2, data_parallel_index=1) == "tcp://[fd00::7]:30002"
