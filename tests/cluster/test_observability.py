"""The chart's Grafana dashboard and PrometheusRule against a real Prometheus (built from its Go module) that
scrapes the real operator (on the local control plane), a real proxy and a real Mooncake master: every dashboard
query and every alert expression is evaluated, none errors and each returns data.

The proxy runs in this test's event loop in front of stand-in encoders and a stand-in PD instance (a proxy-tier
stand-in: no vLLM runs in this tier); the operator reconciles an EPDDeployment on simulated pods, one child of it
deleted by hand (a repair) and one invalid EPDDeployment (Ready False). Each alert's condition is made true:
the pool filled past 95 %, every encoder failing its probes, StoreReady and Ready False.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import subprocess
import urllib.parse
import urllib.request
from typing import Any

import aiohttp
import pytest
import yaml

from epd_connectors.config.roles import Role
from epd_connectors.proxy.app import ProxyApp
from epd_testenv import layout
from tests.cluster.operator_fixtures import EPD_PATH, EXAMPLES, Kube, Operator, eventually, example, free_port
from tests.cluster.test_chart_render import OPERATOR_CHART, one, template
from tests.cluster.test_operator_lifecycle import create, ready
from tests.proxy.harness import FAST, data_url, roster_of, serving
from tests.proxy.stand_ins import StandIn, running
from tests.store.conftest import Mooncake

pytestmark = pytest.mark.cluster
pytest_plugins = ["tests.cluster.operator_fixtures"]

EXAMPLE = next(p for p in EXAMPLES if p.name == "e-pd-mooncake-cross-encoder.yaml")
DASHBOARD = OPERATOR_CHART / "dashboards" / "epd-overview.json"
RATE_INTERVAL = "1m"
"""What Grafana would put in $__rate_interval; with a 1 s scrape, a minute holds enough samples."""
MiB = 1024**2


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every dashboard target, with Grafana's interval variable filled in."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(p["title"], t["expr"].replace("$__rate_interval", RATE_INTERVAL)) for p in panels for t in p["targets"]]


def alert_rules(tmp: pathlib.Path) -> list[dict[str, Any]]:
    """The chart's PrometheusRule groups, as a Prometheus rule file's content."""
    rule = one(template(OPERATOR_CHART, tmp, "--set", "prometheusRule.enabled=true"), "PrometheusRule")
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


class Prometheus:
    """The built prometheus binary on loopback, scraping static targets every second."""

    def __init__(self, workdir: pathlib.Path, targets: dict[str, str], groups: list[dict[str, Any]]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (workdir / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": ["rules.yaml"],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [t]}]} for job, t in targets.items()],
        }
        (workdir / "prometheus.yaml").write_text(yaml.safe_dump(config))
        self.log = workdir / "prometheus.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    str(layout.binary("prometheus")),
                    f"--config.file={workdir / 'prometheus.yaml'}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                cwd=workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        eventually("Prometheus ready", lambda: self.get("/-/ready", raw=True), timeout=60)

    def get(self, path: str, raw: bool = False) -> Any:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as answer:
                body = answer.read().decode()
        except OSError:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited:\n{self.log.read_text()[-3000:]}") from None
            return None
        return body if raw else json.loads(body)

    def query(self, promql: str) -> dict[str, Any]:
        found: dict[str, Any] = self.get("/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        return found

    def targets_up(self) -> bool:
        active = self.get("/api/v1/targets")["data"]["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def returns_data(prometheus: Prometheus, promql: str) -> list[Any] | None:
    answer = prometheus.query(promql)
    assert answer["status"] == "success", f"{promql}: {answer}"
    result: list[Any] = answer["data"]["result"]
    return result or None


def test_every_dashboard_query_and_alert_returns_data_from_the_real_components(
    operator: Operator, kube: Kube, op_namespace: str, tmp_path: pathlib.Path
) -> None:
    # The operator: a deployment on simulated pods, Ready; one child deleted (a repair); one invalid deployment.
    doc = example(EXAMPLE, op_namespace)
    create(kube, doc)
    name = doc["metadata"]["name"]
    ready(kube, op_namespace, name)
    [configmap_name, *_] = [o["metadata"]["name"] for o in kube.children(op_namespace, name, (("v1", "configmaps"),))]
    configmap = f"/api/v1/namespaces/{op_namespace}/configmaps/{configmap_name}"
    kube.delete(configmap)
    eventually("the deleted ConfigMap restored", lambda: kube.find(configmap), timeout=10)
    invalid = example(EXAMPLE, op_namespace, name="invalid")
    invalid["spec"]["model"]["mmProcessorCacheGB"] = 0  # reuse needs the processor cache: Valid False
    kube.request("POST", EPD_PATH.format(ns=op_namespace), invalid)  # its claims exist already
    eventually(
        "the invalid deployment reported",
        lambda: (kube.epd(op_namespace, "invalid").get("status") or {}).get("phase") == "Invalid",
        timeout=30,
    )

    # The store: a master whose pool fills without eviction, one 16 MiB segment.
    (tmp_path / "mooncake").mkdir()
    mooncake = Mooncake(tmp_path / "mooncake")
    try:
        master = mooncake.master(eviction_high_watermark_ratio=1.0)
        owner = mooncake.client(master, global_segment_size="16 MiB")
        requester = mooncake.requester(owner.config.requester_config(local_buffer_size="16 MiB"))
        asyncio.run(_with_the_proxy(operator, master.metrics_url, requester, tmp_path))
    finally:
        mooncake.close()


async def _with_the_proxy(operator: Operator, master_metrics: str, requester: Any, tmp_path: pathlib.Path) -> None:
    encoders = [StandIn(f"e{i}", role="encoder") for i in range(2)]
    pd = StandIn("pd0")
    async with running(*encoders, pd):
        app = ProxyApp(roster_of({Role.ENCODER: encoders, Role.PD: [pd]}), FAST)
        async with serving(app) as proxy, aiohttp.ClientSession() as session:

            async def describe(image: int) -> None:
                content = [
                    {"type": "text", "text": "describe"},
                    {"type": "image_url", "image_url": {"url": data_url(f"image {image}")}},
                ]
                body = {"model": "tiny", "messages": [{"role": "user", "content": content}]}
                async with session.post(proxy + "/v1/chat/completions", json=body) as answer:
                    assert answer.status == 200, await answer.text()

            await describe(0)
            # One encoder error, retried on the other: the same image goes to the same encoder (affinity, which
            # follows the stand-ins' ports, so which one is not fixed).
            [first] = [e for e in encoders if e.requests]
            first.statuses = [500]
            for image in (0, 1, 2, 0, 1, 2):
                await describe(image)
            assert not first.statuses, "the image's second request did not reach its first encoder"
            for n in range(16):  # the 16 MiB pool full (past 95 %), and reads for the hit rate
                if requester.put(f"obs/{n}", b"o" * MiB) != 0:
                    break
                requester.get(f"obs/{n}")
            targets = {
                "epd-proxy": proxy.removeprefix("http://"),
                "epd-operator": f"127.0.0.1:{operator.metrics_port}",
                "mooncake-master": master_metrics.removeprefix("http://").removesuffix("/metrics"),
            }
            prometheus = await asyncio.to_thread(Prometheus, tmp_path, targets, alert_rules(tmp_path))
            try:
                await _check(prometheus, encoders, alert_rules(tmp_path))
            finally:
                await asyncio.to_thread(prometheus.stop)


async def _check(prometheus: Prometheus, encoders: list[StandIn], groups: list[dict[str, Any]]) -> None:
    await asyncio.to_thread(eventually, "every target scraped", prometheus.targets_up, timeout=30)
    await asyncio.sleep(3)  # a few samples of every series, for the rates
    for title, promql in dashboard_queries():
        found = await asyncio.to_thread(returns_data, prometheus, promql)
        assert found, f"dashboard panel {title!r}: {promql} returned no data"

    for encoder in encoders:  # every encoder fails its probes: the proxy evicts them
        encoder.health = 503
    # The other conditions hold already: the pool past 95 %, the invalid deployment (Ready False, and
    # StoreReady and TransferReady Unknown: nothing of it was applied).
    rules = [rule for group in groups for rule in group["rules"]]
    assert {r["alert"] for r in rules} == {
        "EPDNoHealthyEncoder",
        "EPDStoreNearlyFull",
        "EPDNotReady",
        "EPDStoreNotReady",
        "EPDTransferFailing",
    }

    def every_alert_holds() -> bool:
        return all(returns_data(prometheus, rule["expr"]) for rule in rules)

    def without_data() -> str:
        return "no data: " + ", ".join(r["alert"] for r in rules if not returns_data(prometheus, r["expr"]))

    await asyncio.to_thread(
        eventually, "every alert's condition to hold", every_alert_holds, timeout=30, detail=without_data
    )
    rule_groups = (await asyncio.to_thread(prometheus.get, "/api/v1/rules"))["data"]["groups"]
    unhealthy = [(r["name"], r.get("lastError")) for g in rule_groups for r in g["rules"] if r["health"] != "ok"]
    assert unhealthy == [], unhealthy
