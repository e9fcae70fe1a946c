"""The exported metrics: names, labels, the affinity ratio and the roster gauges (epd_connectors.proxy.metrics)."""

from __future__ import annotations

import pytest

from epd_connectors.config.roles import Role
from epd_connectors.proxy.metrics import ProxyMetrics
from epd_connectors.proxy.roster import InstanceSpec, Roster

pytestmark = pytest.mark.unit


def test_affinity_ratio_and_roster_gauges() -> None:
    metrics = ProxyMetrics()
    for hit in (True, True, True, False):
        metrics.affinity_result(hit)
    roster = Roster.build({Role.PD: [InstanceSpec("http://a"), InstanceSpec("http://b")]})
    roster.instances()[0].healthy = True
    text = metrics.render(roster).decode()
    assert "epd_proxy_encoder_affinity_hit_ratio 0.75" in text
    assert 'epd_proxy_encoder_affinity_total{result="hit"} 3.0' in text
    assert 'epd_proxy_roster_instances{role="pd",state="healthy"} 1.0' in text
    assert 'epd_proxy_roster_instances{role="pd",state="unhealthy"} 1.0' in text


def test_every_family_is_exported() -> None:
    metrics = ProxyMetrics()
    metrics.stage_seconds.labels("encode").observe(0.1)
    metrics.backend_requests.labels("encoder", "http://e").inc()
    metrics.backend_errors.labels("encoder", "http://e", "bad_gateway").inc()
    metrics.retries.labels("encoder", "http://e").inc()
    metrics.requests.labels("/v1/chat/completions", "200").inc()
    text = metrics.render(Roster.build({})).decode()
    for name in (
        'epd_proxy_stage_seconds_bucket{le="0.25",stage="encode"} 1.0',
        'epd_proxy_backend_requests_total{instance="http://e",role="encoder"} 1.0',
        'epd_proxy_backend_errors_total{instance="http://e",kind="bad_gateway",role="encoder"} 1.0',
        'epd_proxy_retries_total{instance="http://e",role="encoder"} 1.0',
        'epd_proxy_requests_total{endpoint="/v1/chat/completions",status="200"} 1.0',
        "epd_proxy_requests_in_flight 0.0",
    ):
        assert name in text
