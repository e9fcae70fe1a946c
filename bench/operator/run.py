"""How fast the operator turns an EPDDeployment into children and into Ready, alone and fifty at once.

On a local control plane of its own (.run/bench-operator: real apiserver, controllers and scheduler, kwok
nodes with 896 simulated GPUs), with `epd-operator` running as a subprocess on loopback:

1. 20 times, one 2E/1P/1D deployment with a Mooncake store: from the POST to every child existing, and to
   Ready (all simulated pods Ready). Goals: children p50 < 1 s, Ready p50 < 1 s.
2. 50 such deployments posted at once: until all 50 are Ready, against the control-plane floor of the same run
   (the same objects applied with no operator). Goal: within 1.3x the floor. `ROUNDS` rounds of each, in pairs
   ordered operator, floor, then floor, operator, and so on, so that a slow stretch of the machine weighs on both
   alike; the ratio is of their sums (one round varies by up to 30 % between runs of the same code on the 2-core
   machines here). Every round has a namespace of its own, deleted after it (the controllers' work per pod grows
   with the Services and PodDisruptionBudgets beside it, and the scheduler's with the pods), and starts once every
   process has gone quiet: each round meets the cluster of the first, not the tail of the one before.
3. Steady state: the operator's writes (status writes, applies that changed something, repairs) over 20 s with
   all 71 deployments Ready and nothing changing, after the first round. Goal: 0.
4. The operator's peak RSS (VmHWM from /proc) after the first round, holding 71 deployments as when the goal was
   set. Goal: <= 115 MB (the figure of 2026-12-03). The peak over the whole run is printed too.

Prints a table, then where the fifty's cost goes against the floor's: each process's CPU seconds, and the API
requests and watch events (the API server's own counters) whose counts differ most. Only the apiserver and the
operator's own metrics/liveness endpoints are ever contacted.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from epd_operator.api.resource import OperatorDefaults, Owner, parse_spec
from epd_operator.render import render_desired
from epd_testenv import cluster, layout, nodes, process

sys.path.insert(0, str(layout.repo_root()))  # the cluster tests' helpers (Kube, Operator)
from tests.cluster.operator_fixtures import (
    EPD_PATH,
    NAMESPACE_PREFIX,
    Kube,
    Operator,
    condition,
    example,
    prometheus_samples,
)

STATE_DIR = layout.repo_root() / ".run" / "bench-operator"
RUNS = 20
AT_ONCE = 50
NAMESPACE = f"{NAMESPACE_PREFIX}bench"
ROUNDS = 4
POOL = nodes.NodePool(count=28, gpus=32)
"""896 GPUs and 3,080 pod slots (4 GPUs and 7 pods a deployment): the nodes of earlier runs, which kept every round;
each round is deleted now, so the 21 sequential runs and one round at a time use about a third of it."""
QUIET_CPU_S = 0.25
"""A round starts once every process together used less than this in one second (the idle control plane's heartbeats
and leases stay under it)."""
FIFTY_NAMESPACE = f"{NAMESPACE_PREFIX}fifty-{{round}}"
"""Created just before its round, which starts once the operator's watches run there (the control plane quiet
again); created all at the start, the namespaces of later rounds held idle watch streams, about 12 MB of the
operator's RSS after the first round."""
FLOOR_NAMESPACE = "epd-floor-{round}"
"""Outside the operator's namespaces (NAMESPACE_PREFIX), so it keeps running, idle, while the floor is measured."""
GOALS = {"children": 1.0, "ready": 1.0, "fifty_over_floor": 1.3, "steady_writes": 0, "rss_mb": 115.0}
STEADY_S = 20.0
WRITES = (
    "epd_operator_status_writes_total",
    'epd_operator_reconciles_total{outcome="changed"}',
    "epd_operator_repairs_total",
)
"""The operator's own writes, as its metrics count them (a repair is counted per kind and cause: summed)."""


def spec(name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    """Two encoders, one prefill, one decode, a standalone store with one small client, one proxy."""
    doc = example(layout.repo_root() / "examples" / "e-p-d-store-offload.yaml", namespace, name)
    s = doc["spec"]
    s["encoder"]["replicas"] = 2
    s["prefill"].update(replicas=1, additionalPools=[])
    s["decode"].update(replicas=1, tensorParallelSize=1)
    s["store"]["clients"].update(replicas=1, segmentSize="4GiB")
    return doc


def ready(live: dict[str, Any]) -> bool:
    return condition(live, "Ready").get("status") == "True"


def one_run(kube: Kube, name: str, children: int) -> tuple[float, float]:
    """Seconds from the POST to every child existing, and to Ready."""
    proxy = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{name}-proxy"
    path = EPD_PATH.format(ns=NAMESPACE) + f"/{name}"
    began = time.perf_counter()
    kube.request("POST", EPD_PATH.format(ns=NAMESPACE), spec(name))
    created = ready_at = 0.0
    while not ready_at:
        now = time.perf_counter() - began
        # The proxy Deployment is applied last; the full list is checked once it exists.
        if not created and kube.find(proxy) is not None:
            created = now
        if ready(kube.get(path)):
            ready_at = time.perf_counter() - began
        if now > 120:
            raise RuntimeError(f"{name} not Ready within 120 s")
        time.sleep(0.01)
    found = len(kube.children(NAMESPACE, name))
    if found != children:
        raise RuntimeError(f"{name}: {found} children, expected {children}")
    return created, ready_at


def create_namespace(kube: Kube, name: str) -> None:
    kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def delete_namespace(kube: Kube, name: str) -> float:
    """Delete a round's namespace and wait until it is gone (its pods deleted, their GPUs free); the seconds."""
    began = time.perf_counter()
    kube.delete(f"/api/v1/namespaces/{name}")
    while kube.find(f"/api/v1/namespaces/{name}") is not None:
        if time.perf_counter() - began > 300:
            raise RuntimeError(f"namespace {name} not gone within 300 s")
        time.sleep(0.5)
    return time.perf_counter() - began


def quiet(pids: dict[str, int]) -> None:
    """Wait (at most 120 s) until every process together uses less than `QUIET_CPU_S` in a second."""
    began = time.perf_counter()
    last = sum(cpu_seconds(pids).values())
    while time.perf_counter() - began < 120:
        time.sleep(1.0)
        now = sum(cpu_seconds(pids).values())
        if now - last < QUIET_CPU_S:
            return
        last = now


def fifty(kube: Kube, namespace: str) -> float:
    collection = EPD_PATH.format(ns=namespace)
    began = time.perf_counter()
    for i in range(AT_ONCE):
        kube.request("POST", collection, spec(f"many-{i}", namespace))
    while True:
        items = kube.items(collection)
        if sum(1 for x in items if ready(x)) == AT_ONCE:
            return time.perf_counter() - began
        if time.perf_counter() - began > 300:
            raise RuntimeError(f"{AT_ONCE} deployments not Ready within 300 s")
        time.sleep(0.25)


def floor(kube: Kube, namespace: str) -> float:
    """The control plane alone: the same 50 deployments' objects applied directly (8 at a time, no operator),
    until every workload is ready. The operator cannot beat this; the difference is its own cost."""
    objects = []
    for i in range(AT_ONCE):
        doc = spec(f"many-{i}", namespace)
        desired = render_desired(
            Owner(doc["metadata"]["name"], namespace, f"uid-{i}"), parse_spec(doc["spec"]), OperatorDefaults()
        )
        for obj in desired.objects:
            obj["metadata"].pop("ownerReferences")  # no owner exists
            objects.append(obj)
    workloads = sum(1 for o in objects if o["kind"] in ("Deployment", "StatefulSet"))
    began = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(kube.apply, objects))
    while True:
        listed = [
            *kube.items(f"/apis/apps/v1/namespaces/{namespace}/deployments"),
            *kube.items(f"/apis/apps/v1/namespaces/{namespace}/statefulsets"),
        ]
        done = sum(1 for w in listed if (w.get("status") or {}).get("readyReplicas", 0) >= w["spec"]["replicas"])
        if done == workloads:
            return time.perf_counter() - began
        if time.perf_counter() - began > 300:
            raise RuntimeError("the control plane alone did not make the workloads ready within 300 s")
        time.sleep(0.25)


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU each process has used so far (/proc/<pid>/stat), by name."""
    tick = os.sysconf("SC_CLK_TCK")
    used = {}
    for name, pid in pids.items():
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        used[name] = (int(fields[11]) + int(fields[12])) / tick
    return used


_COUNTED = re.compile(r"^(apiserver_request_total|apiserver_watch_events_total)\{(.*)\}$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def api_requests(kube: Kube) -> Counter[str]:
    """The API server's requests so far, by verb and resource, and the watch events it sent, by kind (its own
    counters, every client)."""
    raw = kube.api.call_api("GET", kube.api.configuration.host + "/metrics", _request_timeout=30).read()  # type: ignore[no-untyped-call]
    counts: Counter[str] = Counter()
    for name, value in prometheus_samples(raw.decode()).items():
        if (found := _COUNTED.match(name)) is None:
            continue
        labels = dict(_LABEL.findall(found.group(2)))
        if found.group(1) == "apiserver_watch_events_total":
            counts[f"watch event {labels.get('resource') or labels.get('kind')}"] += int(value)
        else:
            resource = "/".join(x for x in (labels.get("resource"), labels.get("subresource")) if x)
            counts[f"{labels.get('verb')} {resource}"] += int(value)
    return counts


def spent(kube: Kube, pids: dict[str, int], phase: Callable[[], float]) -> tuple[float, dict[str, float], Counter[str]]:
    """`phase`'s seconds, the CPU seconds each process used meanwhile (with every core busy in both phases, as on
    the 2-core machines here, the difference between the operator's run and the floor is this work), and the API
    requests it made."""
    before, requests = cpu_seconds(pids), api_requests(kube)
    seconds = phase()
    after = cpu_seconds(pids)
    requests = api_requests(kube) - requests
    return seconds, {name: after[name] - before[name] for name in pids}, requests


def print_rows(rows: list[tuple[str, float, float | None, str, bool]]) -> None:
    print(f"\noperator benchmark: {RUNS} runs of a 2E/1P/1D deployment with a store; {POOL.count} kwok nodes")
    print(f"{'measure':44} {'p50 / value':>12} {'p95':>8}  {'goal':10} met")
    for label, value, high, goal, met in rows:
        unit = "" if "RSS" in label or "writes" in label else " s"
        p95_text = f"{high:.2f}{unit}" if high is not None else "-"
        print(f"{label:44} {value:>10.2f}{unit:2} {p95_text:>8}  {goal:10} {'yes' if met else 'NO'}")


def print_costs(cpu: tuple[Counter[str], Counter[str]], requests: tuple[Counter[str], Counter[str]]) -> None:
    """The CPU seconds and the API requests of the fifties against the floors': where the difference goes."""
    print(f"CPU seconds used in the {ROUNDS} rounds of each (the machine has {os.cpu_count()} cores):")
    print(f"  {'process':40} {'50 at once':>10} {'floor':>8}")
    for name in cpu[0]:
        print(f"  {name:40} {cpu[0][name]:>10.1f} {cpu[1].get(name, 0.0):>8.1f}")
    print(f"  {'all':40} {sum(cpu[0].values()):>10.1f} {sum(cpu[1].values()):>8.1f}")
    print("API requests and watch events sent (every client), the largest differences:")
    differences = sorted(requests[0].keys() | requests[1].keys(), key=lambda k: -abs(requests[0][k] - requests[1][k]))
    for what in differences[:16]:
        print(f"  {what:40} {requests[0][what]:>10} {requests[1][what]:>8}")
    print(f"  {'all':40} {sum(requests[0].values()):>10} {sum(requests[1].values()):>8}")


@dataclass
class Phases:
    """The rounds of one kind of phase: their seconds, and their CPU seconds and API requests summed."""

    seconds: list[float] = field(default_factory=list)
    cpu: Counter[str] = field(default_factory=Counter)
    requests: Counter[str] = field(default_factory=Counter)

    def add(self, seconds: float, cpu: dict[str, float], requests: Counter[str]) -> None:
        self.seconds.append(seconds)
        self.cpu.update(cpu)
        self.requests.update(requests)

    @property
    def mean_s(self) -> float:
        return statistics.fmean(self.seconds)


def writes(metrics: dict[str, float]) -> float:
    return sum(v for k, v in metrics.items() if any(k == w or k.startswith(w + "{") for w in WRITES))


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[18]


def rounds(kube: Kube, pids: dict[str, int], operator: Operator) -> tuple[Phases, Phases, float, float]:
    """The fifties and the floors, in pairs; the operator's RSS after its first round and its writes in the steady
    state after it (71 deployments held, as when the goals were set)."""
    fifties, floors = Phases(), Phases()
    rss_mb = steady = 0.0
    for r in range(ROUNDS):
        for which in ("operator", "floor") if r % 2 == 0 else ("floor", "operator"):
            phases, phase, pattern = (
                (fifties, fifty, FIFTY_NAMESPACE) if which == "operator" else (floors, floor, FLOOR_NAMESPACE)
            )
            namespace = pattern.format(round=r)
            create_namespace(kube, namespace)
            quiet(pids)
            phases.add(*spent(kube, pids, functools.partial(phase, kube, namespace)))
            if r == 0 and which == "operator":
                rss_mb = operator.rss_kib() / 1024
                quiet(pids)
                before = writes(operator.metrics())
                time.sleep(STEADY_S)
                steady = writes(operator.metrics()) - before
            deleted_s = delete_namespace(kube, namespace)
            print(f"round {r}, {which}: {phases.seconds[-1]:.1f} s (deleted in {deleted_s:.1f} s)", flush=True)
    return fifties, floors, rss_mb, steady


def main() -> int:
    local = cluster.Cluster(STATE_DIR, cluster.Settings(pool=POOL))
    local.up()
    operator: Operator | None = None
    try:
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(local.kubeconfig), client_configuration=configuration)  # type: ignore[no-untyped-call]
        kube = Kube(client.ApiClient(configuration))
        crd = (layout.repo_root() / "crds" / "epddeployments.yaml").read_text()
        kube.request(
            "PATCH",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/epddeployments.epd.serving.io"
            "?fieldManager=bench&force=true",
            yaml.safe_load(crd),
            "application/apply-patch+yaml",
        )
        time.sleep(2.0)  # the CRD's storage comes up a moment after it is established
        create_namespace(kube, NAMESPACE)
        log = Path(tempfile.mkdtemp(prefix="epd-bench-operator-")) / "operator.log"
        operator = Operator(local.kubeconfig, log)
        operator.start()
        owner = Owner("x", NAMESPACE, "u")
        children = len(render_desired(owner, parse_spec(spec("x")["spec"]), OperatorDefaults()).objects)
        one_run(kube, "warmup", children)  # the first one pays for watch streams and connection set-up
        runs = [one_run(kube, f"run-{i}", children) for i in range(RUNS)]
        created = [r[0] for r in runs]
        became_ready = [r[1] for r in runs]
        assert operator.process is not None
        pids = {**{p.name: p.pid for p in process.load(STATE_DIR)[0]}, "operator": operator.process.pid}
        fifties, floors, rss_mb, steady = rounds(kube, pids, operator)
        metrics = operator.metrics()
        rss_end_mb = operator.rss_kib() / 1024
    finally:
        if operator is not None:
            operator.stop()
        local.down()

    mean_reconcile = (
        metrics["epd_operator_reconcile_duration_seconds_sum"]
        / metrics["epd_operator_reconcile_duration_seconds_count"]
    )
    rows = [
        (
            f"children created ({children} objects)",
            statistics.median(created),
            p95(created),
            "p50 < 1 s",
            GOALS["children"] > statistics.median(created),
        ),
        (
            "Ready (all pods Ready)",
            statistics.median(became_ready),
            p95(became_ready),
            "p50 < 1 s",
            GOALS["ready"] > statistics.median(became_ready),
        ),
        (f"{AT_ONCE} deployments at once -> all Ready (mean)", fifties.mean_s, None, "-", True),
        (
            f"  the same with no operator (floor); ratio {fifties.mean_s / floors.mean_s:.2f}x",
            floors.mean_s,
            None,
            "<= 1.3x",
            fifties.mean_s <= GOALS["fifty_over_floor"] * floors.mean_s,
        ),
        (f"writes in {STEADY_S:.0f} s of steady state", steady, None, "0", steady == GOALS["steady_writes"]),
        (
            f"operator peak RSS (MB), {RUNS + 1 + AT_ONCE} deployments",
            rss_mb,
            None,
            "<= 115 MB",
            GOALS["rss_mb"] >= rss_mb,
        ),
    ]
    print_rows(rows)
    pairs = ", ".join(f"{o:.1f}/{f:.1f}" for o, f in zip(fifties.seconds, floors.seconds, strict=True))
    ratios = [o / f for o, f in zip(fifties.seconds, floors.seconds, strict=True)]
    print(f"rounds, operator/floor in s: {pairs}; per pair {min(ratios):.2f}-{max(ratios):.2f}x")
    print_costs((fifties.cpu, floors.cpu), (fifties.requests, floors.requests))
    count = metrics["epd_operator_reconcile_duration_seconds_count"]
    print(f"mean reconcile (operator metric): {mean_reconcile * 1000:.0f} ms over {count:.0f} reconciles")
    print(f"status writes: {metrics.get('epd_operator_status_writes_total', 0):.0f}")
    print(f"operator peak RSS over the whole run (each round deleted after it): {rss_end_mb:.2f} MB")
    print(
        f"control-plane floor: the same {AT_ONCE} deployments' objects applied directly (8 at a time), no operator: "
        f"all workloads ready in {floors.mean_s:.1f} s (mean of {ROUNDS})"
    )
    return 0 if all(r[4] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
