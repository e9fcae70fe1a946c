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
    roster.instances()[0].outstanding, roster.instances()[1].outstanding = 3, 2
    text = metrics.render(roster).decode()
    assert "epd_proxy_encoder_affinity_hit_ratio 0.75" in text
    assert 'epd_proxy_encoder_affinity_total{result="hit"} 3.0' in text
    assert 'epd_proxy_roster_instances{role="pd",state="healthy"} 1.0' in text
    assert 'epd_proxy_roster_instances{role="pd",state="unhealthy"} 1.0' in text
    assert 'epd_proxy_backend_in_flight{role="pd"} 5.0' in text


def test_every_family_is_exported() -> None:
    metrics = ProxyMetrics()
    metrics.observe_stage("encode", 0.1)
    metrics.count_backend("encoder", "http://e")
    metrics.backend_errors.labels("encoder", "http://e", "bad_gateway").inc()
    metrics.retries.labels("encoder", "http://e").inc()
    metrics.count_request("/v1/chat/completions", "200")
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


def test_stage_buckets_are_cumulative_with_their_sum_and_count() -> None:
    """Bounds are inclusive, as Prometheus's le says; +Inf and _count hold every observation."""
    metrics = ProxyMetrics()
    for seconds in (0.005, 0.006, 0.3, 400.0):
        metrics.observe_stage("total", seconds)
    text = metrics.render(Roster.build({})).decode()
    for line in (
        'epd_proxy_stage_seconds_bucket{le="0.005",stage="total"} 1.0',
        'epd_proxy_stage_seconds_bucket{le="0.01",stage="total"} 2.0',
        'epd_proxy_stage_seconds_bucket{le="0.25",stage="total"} 2.0',
        'epd_proxy_stage_seconds_bucket{le="0.5",stage="total"} 3.0',
        'epd_proxy_stage_seconds_bucket{le="300.0",stage="total"} 3.0',
        'epd_proxy_stage_seconds_bucket{le="+Inf",stage="total"} 4.0',
        'epd_proxy_stage_seconds_count{stage="total"} 4.0',
        'epd_proxy_stage_seconds_sum{stage="total"} 400.311',
    ):
        assert line in text, line
