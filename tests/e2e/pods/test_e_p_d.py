"""examples/local-e-p-d.yaml on real pods, then its lifecycle under continuous load.

The deployment (Mooncake master and store client, encoder, prefill, decode, proxy: six real containers the
operator created) answers through `kubectl port-forward svc/local-e-p-d-proxy` exactly as the session's
baseline, and the counters prove the transfers as the local tier does (tests/e2e/test_local_e_p_d.py): no
prompt token computed by the decode, KV from the P2P peer, keys in the store under the deployment's prefix.

Then, each reported as a figure (e2e timings): the encoders scaled 1 -> 2 while requests flow (the proxy's roster
follows the EndpointSlices; no request fails); a decode pod deleted (replaced by its Deployment; how long until
requests succeed again); the leading master's pod deleted (the store's masters are HA here, two electing through
an etcd the harness runs on the bridge: how long until another master leads, what the clients saw, and that the
status names the new leader); a second model (a tiny model of another seed, so other answers) rolled in as a new
revision while requests flow (each revision's pods take traffic only as a whole set, the proxy pairs only pods of
one revision: no request fails, no answer matches neither model), last, as the tests before compare answers with
the first model's; `kubectl describe` and `kubectl logs`; the EPDDeployment deleted (every child and container
gone). The model roles roll with maxSurge 1 (spec.*.maxSurge): with the default of replacing one pod at a time, a
role of one replica is down while its new pod loads.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from epd_connectors.config.roles import Role
from epd_connectors.proxy import errors
from epd_operator.api import constants as c
from epd_testenv import nodehost
from tests.e2e.conftest import SETUP_HINT, TIMINGS, VllmInstance
from tests.e2e.pods.conftest import (
    Applied,
    RealCluster,
    RealEPD,
    get_text,
    is_ready,
    ready,
    tiny_model_for_pods,
    workload,
)
from tests.e2e.pods.kube import eventually
from tests.e2e.pods.traffic import LOAD, Load, loads, patch, pod_ready, roster
from tests.e2e.test_local_e_p_d import (
    CASES,
    LONG_QUESTION,
    ask,
    assert_the_decode_computed_no_prompt_token,
    chat,
    image,
    new_store_keys,
    serve_case,
    text,
    tokens,
    total,
)
from tests.tiny_model import build as tiny_model_build

pytestmark = [pytest.mark.e2e, pytest.mark.pods, pytest.mark.timeout(2400)]

ROLL_TIMEOUT_S = 1200.0
OTHER_SEED = 2
"""The second model's weights seed (tools/tinymodel --seed): a second revision that answers differently."""
STORE_BACK_S = 300.0
LEADER_S = 300.0
"""A master's lease (5 s) lapses, a candidate wins and warms up (5 s), the operator reads it (every 15 s)."""
TRANSFER_S = 240.0
"""How long a path's break or repair may take to show in TransferReady: two failed canaries (10 s each, 5 s
apart) after at most one interval (60 s), or one passing canary after the backoff, and the operator's next
reading (10 s)."""


@pytest.fixture(scope="module")
def epd(request: pytest.FixtureRequest, e_p_d_applied: Applied) -> Iterator[RealEPD]:
    with ready(request, e_p_d_applied) as it:
        ask(it.endpoint, chat("Warm up the transfer engines, please."))
        yield it


@pytest.fixture
def load(epd: RealEPD, baseline: VllmInstance) -> Iterator[Load]:
    with loads(epd, baseline) as [running]:
        yield running


def settled(epd: RealEPD) -> bool:
    """Ready at the latest generation, and no pod of it terminating or not ready (but a standby master, which is
    never Ready: only the leader is)."""
    obj = epd.get()
    if not is_ready(obj) or obj["status"].get("observedGeneration") != obj["metadata"]["generation"]:
        return False
    return all(not p["metadata"].get("deletionTimestamp") and (_is_master(p) or pod_ready(p)) for p in epd.pods())


def _is_master(pod: dict[str, Any]) -> bool:
    return bool(pod["metadata"]["labels"][c.LABEL_COMPONENT] == "master")


OPLOG_SETTLE_S = 2.0
"""Between reading the leader's keys and deleting it: the oplog commits in batches, so the newest put may reach
etcd a moment after the leader lists it."""


def masters(epd: RealEPD) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The leading master's pod (the one Ready) and the others."""
    pods = [p for p in epd.pods() if _is_master(p) and not p["metadata"].get("deletionTimestamp")]
    leaders = [p for p in pods if pod_ready(p)]
    assert len(leaders) == 1, [(p["metadata"]["name"], p["status"].get("containerStatuses")) for p in pods]
    return leaders[0], [p for p in pods if p is not leaders[0]]


def reported_leader(epd: RealEPD) -> str:
    return str((epd.get().get("status", {}).get("store") or {}).get("leader", ""))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_proxy_answers_as_the_baseline_and_the_decode_computes_no_prompt_token(
    epd: RealEPD, baseline: VllmInstance, case: str, stream: bool
) -> None:
    delta = serve_case(epd, baseline, case, stream, "E+P+D on real pods")
    assert_the_decode_computed_no_prompt_token(delta, case)


def test_a_fresh_prompt_lands_in_the_store_under_the_deployments_prefix(epd: RealEPD) -> None:
    keys_before = epd.store_keys()
    ask(epd.endpoint, chat([image(33), text(LONG_QUESTION)]))
    keys = new_store_keys(epd, keys_before)
    assert len(keys) >= 2, "a prompt of several full blocks stored fewer than two"
    assert epd.kv_prefix and all(epd.kv_prefix in key for key in keys)


def test_the_status_reports_the_store_as_its_master_does(epd: RealEPD) -> None:
    """The operator, in its own pod, reads the master through its Service (the cluster's DNS on the bridge) as
    the store's users reach it: status.store holds the segment the store client mounted and the keys the prompts
    above left."""

    def reported() -> dict[str, Any] | None:
        store: dict[str, Any] = epd.get().get("status", {}).get("store") or {}
        return store if store.get("reachable") and store.get("keyCount", 0) > 0 else None

    store = eventually(reported, "status.store with the prompts' keys", 90, poll_s=2)
    assert store["capacityBytes"] == 256 * 1024**2, store  # the example's one client, segmentSize 256MiB
    assert len(store["segments"]) == 1 and store["mountedClients"] >= 1 and store["usedBytes"] > 0, store
    leader, standbys = masters(epd)
    assert store["leader"] == f"{leader['status']['podIP']}:50051" and len(standbys) == 1, store
    conditions = {x["type"]: x["status"] for x in epd.get()["status"]["conditions"]}
    assert conditions[c.COND_STORE_READY] == "True", conditions


def test_the_encoders_scale_to_two_under_load_and_the_proxy_follows(epd: RealEPD, load: Load) -> None:
    began = time.monotonic()
    patch(epd, {"encoder": {"replicas": 2}})
    eventually(lambda: roster(epd, "encoder") == 2, "the proxy's roster to hold 2 healthy encoders", ROLL_TIMEOUT_S)
    TIMINGS.add("real pods: encoders 1 -> 2, until the proxy routes to both", time.monotonic() - began)
    eventually(lambda: settled(epd), "the deployment Ready with 2 encoders", ROLL_TIMEOUT_S)
    answered = len(load.answers)
    eventually(lambda: len(load.answers) >= answered + len(LOAD), "the load answered with 2 encoders", 120)
    load.stop()
    load.report("scale-out under load")
    assert not load.failed and not load.wrong, (load.failed, load.wrong)
    assert len([p for p in epd.pods() if p["metadata"]["labels"][c.LABEL_COMPONENT] == "encoder"]) == 2


def test_an_encoder_that_cannot_reach_the_prefill_is_routed_around_until_the_path_is_repaired(
    epd: RealEPD, baseline: VllmInstance, real_cluster: RealCluster
) -> None:
    """The EC path of one encoder to the prefill is broken on purpose: inside the prefill pod's network namespace,
    TCP from that encoder's pod IP to the prefill's EC control ports is dropped (as a NetworkPolicy or a firewall
    would). Every pod stays Ready; the proxy's canaries find the pair, TransferReady names it, no user request
    goes through that encoder, and answers stay the baseline's; once the rule is gone it recovers by itself."""
    pods = epd.pods()
    encoders = sorted((p for p in pods if p["metadata"]["labels"][c.LABEL_COMPONENT] == "encoder"), key=_name)
    (prefill,) = (p for p in pods if p["metadata"]["labels"][c.LABEL_COMPONENT] == "prefill")
    cut, kept = encoders[-1], encoders[0]
    cut_url = f"http://{cut['status']['podIP']}:{ports_of(cut)['http']}"
    ec_ports = [port for name, port in ports_of(prefill).items() if name.startswith("ec")]
    assert ec_ports, ports_of(prefill)
    eventually(lambda: _transfer_ready(epd) == "True", "TransferReady True before the break", TRANSFER_S)
    pid = nodehost.pod_pid(real_cluster.local.node_files, epd.namespace, _name(prefill))
    began = time.monotonic()
    nodehost.block(pid, cut["status"]["podIP"], ec_ports)
    try:
        failing = eventually(lambda: _failing(epd), "TransferReady False naming the cut pair", TRANSFER_S, poll_s=2)
        TIMINGS.add("real pods: an EC path cut, until TransferReady names it", time.monotonic() - began)
        message = next(x["message"] for x in epd.get()["status"]["conditions"] if x["type"] == "TransferReady")
        assert f"ec {_name(cut)} -> {_name(prefill)}" in message and "EC control ports" in message, message
        assert [(f["sender"], f["receiver"]) for f in failing] == [(_name(cut), _name(prefill))], failing
        assert _name(kept) not in message
        assert all(_is_master(p) or pod_ready(p) for p in epd.pods()), "every pod Ready (a standby master never is)"
        conditions = {x["type"]: x["status"] for x in epd.get()["status"]["conditions"]}
        assert all(conditions[kind] == "True" for kind in ROLE_CONDITIONS), conditions
        assert conditions["Ready"] == "False", conditions

        before = _served_by(epd, cut_url)
        for seed in range(40, 48):
            content = [image(seed), text("What is this?")]
            assert ask(epd.endpoint, chat(content)) == tokens(baseline.post("/v1/chat/completions", chat(content)))
        assert _served_by(epd, cut_url) == before, "a user request went through the cut encoder"
    finally:
        nodehost.unblock(pid)
    repaired = time.monotonic()
    eventually(lambda: _transfer_ready(epd) == "True", "TransferReady True once the path works", TRANSFER_S, poll_s=2)
    TIMINGS.add("real pods: the EC path repaired, until TransferReady is True", time.monotonic() - repaired)
    eventually(lambda: is_ready(epd.get()), "Ready again", 60)
    transfers = epd.get()["status"]["transfers"]
    TIMINGS.milliseconds("real pods: slowest canary of a working path", float(transfers["slowestMs"]))
    assert transfers["failing"] == [] and transfers["proven"] == transfers["pairs"] >= 3, transfers
    before = _served_by(epd, cut_url)
    for seed in range(48, 64):
        ask(epd.endpoint, chat([image(seed), text("And this?")]))
    assert _served_by(epd, cut_url) > before, "the repaired encoder serves users again"


ROLE_CONDITIONS = ("EncodersReady", "PrefillReady", "DecodeReady", "ProxyReady", "StoreReady")


def _name(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["name"])


def ports_of(pod: dict[str, Any]) -> dict[str, int]:
    (container,) = pod["spec"]["containers"]
    return {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}


def _transfer_ready(epd: RealEPD) -> str:
    found = next((x for x in epd.get()["status"]["conditions"] if x["type"] == "TransferReady"), None)
    return str(found["status"]) if found else ""


def _failing(epd: RealEPD) -> list[dict[str, Any]] | None:
    status = epd.get()["status"]
    failing: list[dict[str, Any]] = (status.get("transfers") or {}).get("failing") or []
    return failing if failing and _transfer_ready(epd) == "False" else None


def _served_by(epd: RealEPD, encoder_url: str) -> float:
    """Client requests the proxy sent to this encoder (its canaries count elsewhere)."""
    return total(epd.metrics(Role.PROXY), "epd_proxy_backend_requests_total", role="encoder", instance=encoder_url)


@pytest.fixture(scope="module")
def other_model(e2e_python: Path) -> Path:
    """A second tiny model: the same shape and tokenizer, other weights (another seed), so other answers."""
    return tiny_model_for_pods(tiny_model_build(e2e_python, SETUP_HINT, seed=OTHER_SEED))


def model_pods(epd: RealEPD) -> list[dict[str, Any]]:
    return [p for p in epd.pods() if c.LABEL_MODEL_REVISION in p["metadata"]["labels"]]


def rolled(epd: RealEPD, away_from: str) -> bool:
    """Ready at a revision other than `away_from`, every model pod of it (the old set's pods all gone)."""
    revision = epd.get()["status"].get("modelRevision")
    labels = {p["metadata"]["labels"][c.LABEL_MODEL_REVISION] for p in model_pods(epd)}
    return settled(epd) and revision != away_from and labels == {revision}


def test_a_deleted_decode_pod_is_replaced_and_traffic_recovers(epd: RealEPD, load: Load) -> None:
    (decode,) = [p for p in epd.pods() if p["metadata"]["labels"][c.LABEL_COMPONENT] == "decode"]
    began = time.monotonic()
    epd.kubectl.run("delete", "pod", "-n", epd.namespace, decode["metadata"]["name"], "--wait=false")

    def decode_not_ready() -> str | None:
        """DecodeReady's message once it is False."""
        found = next(x for x in epd.get()["status"]["conditions"] if x["type"] == c.COND_DECODE_READY)
        return str(found["message"]) if found["status"] == "False" else None

    # The status names the role that has no ready instance within seconds (its workload's watch event).
    message = eventually(decode_not_ready, "DecodeReady False", 30, poll_s=0.2)
    TIMINGS.add("real pods: decode pod deleted -> DecodeReady False", time.monotonic() - began)
    assert "decode" in message, message
    eventually(lambda: settled(epd) and load.last_ok > began + 1, "a new decode and a request served", ROLL_TIMEOUT_S)
    TIMINGS.add("real pods: decode pod deleted -> requests succeed again", time.monotonic() - began)
    epd.forget(Role.DECODE)
    load.stop()
    load.report("decode pod deleted")
    assert not load.wrong, load.wrong
    # While the only decode is gone, the proxy says so and when to come back: a 503 naming the decode (from the
    # stage that found none, or from the wait for a model revision with a whole set), never a 502 or a hang.
    told = f"HTTP 503 (retry-after {errors.RETRY_AFTER_S})"
    named = ("no healthy decode", "decode none healthy")
    assert all(told in f and any(n in f for n in named) for f in load.failed), load.failed


def test_the_leading_masters_pod_deleted_under_load_another_master_leads_and_requests_go_on(
    epd: RealEPD, load: Load
) -> None:
    leader, [standby] = masters(epd)
    eventually(lambda: reported_leader(epd) == f"{leader['status']['podIP']}:50051", "status.store.leader", 60)
    put_before = epd.store_keys()
    assert put_before, "the load put nothing into the store"
    time.sleep(OPLOG_SETTLE_S)
    began = time.monotonic()
    epd.kubectl.run("delete", "pod", "-n", epd.namespace, leader["metadata"]["name"], "--wait=false")

    def a_new_leader_reported() -> str | None:
        # The standby and the deleted pod's replacement both campaign once the lease lapses; either may win.
        reported = reported_leader(epd)
        return reported if reported and reported != f"{leader['status']['podIP']}:50051" else None

    new_leader = eventually(a_new_leader_reported, "status.store.leader naming another master", LEADER_S)
    TIMINGS.add("real pods: leading master deleted -> status names another master", time.monotonic() - began)

    def serving(pod: dict[str, Any]) -> bool:
        return f"{pod['status']['podIP']}:50051" == new_leader

    eventually(
        lambda: settled(epd) and serving(masters(epd)[0]) and len(masters(epd)[1]) == 1,
        f"the deployment Ready, {new_leader} the one Ready master and one standby beside it",
        ROLL_TIMEOUT_S,
    )
    TIMINGS.count("real pods: leading master deleted -> the standby leads (1) or the replacement (0)", serving(standby))
    TIMINGS.add("real pods: leading master deleted -> deployment Ready again", time.monotonic() - began)
    epd.forget(Role.MASTER)
    # The leader replicated its metadata through etcd (the oplog, ha.replicateMetadata's default): the new
    # leader holds every object put before the deletion, and their bytes are still in the store client's segment.
    kept = put_before & epd.store_keys()
    TIMINGS.count(f"real pods: leading master deleted -> objects kept of the {len(put_before)} put before", len(kept))
    assert kept == put_before, sorted(put_before - kept)[:5]
    # The store client and the vLLM ranks follow the election by themselves (MC_STORE_CLUSTER_ID), so a fresh
    # prompt's blocks land in the new leader's store.
    seeds = iter(range(34, 1000))

    def a_fresh_prompt_lands() -> bool:
        keys_before = epd.store_keys()
        ask(epd.endpoint, chat([image(next(seeds)), text(LONG_QUESTION)]))
        return bool(new_store_keys(epd, keys_before))

    eventually(a_fresh_prompt_lands, "the new leader's store to take keys", STORE_BACK_S, poll_s=2)
    TIMINGS.add("real pods: leading master deleted -> the store takes keys again", time.monotonic() - began)
    load.stop()
    load.report("leading master deleted")
    assert not load.failed and not load.wrong, (load.failed, load.wrong)


def test_a_new_model_takes_over_as_a_whole_set_and_no_answer_mixes_the_two_models(
    epd: RealEPD, load: Load, other_model: Path
) -> None:
    """Two revisions that answer differently (two tiny models of different seeds): the deployment rolls to the
    other model under continuous load. Every vLLM pod carries its revision; a new pod is held out of Ready until
    its revision has a whole set (the operator's readiness gate), and the proxy pairs only instances of one
    revision. An answer made by one model's encoder and the other's language model, or one model's KV and the
    other's decode, would match neither model's answer: none may, and none may fail. The module's last change
    to the deployment: the tests before it compare answers with the first model's."""
    first_revision = epd.get()["status"]["modelRevision"]
    second = {"revision": f"seed-{OTHER_SEED}", "source": {"hostPath": {"path": str(other_model)}}}
    before = {_name(p) for p in epd.pods()}
    began = time.monotonic()
    patch(epd, {"model": second})
    eventually(
        lambda: rolled(epd, first_revision), "the other model's set Ready and the first's gone", ROLL_TIMEOUT_S, 3
    )
    TIMINGS.add("real pods: a new model rolled in (encoders, prefill and decode)", time.monotonic() - began)
    second_revision = epd.get()["status"]["modelRevision"]
    replaced = {p["metadata"]["labels"][c.LABEL_COMPONENT] for p in epd.pods() if _name(p) not in before}
    assert replaced == {"encoder", "prefill", "decode"}, replaced  # not the store, not the proxy
    assert json.loads(get_text(f"{epd.endpoint}/health"))["modelRevision"] == second_revision
    answers = [ask(epd.endpoint, chat(content)) for content in LOAD]
    assert all(a != b for a, b in zip(answers, load.expected, strict=True)), "the two models must answer apart"

    def by_the_second_model() -> int:
        return sum(1 for i, got in load.answers if got == answers[i])

    eventually(lambda: by_the_second_model() >= len(LOAD), "the load answered by the second model", 120)
    load.stop()
    for role in (Role.ENCODER, Role.PREFILL, Role.DECODE):
        epd.forget(role)
    by_model = [(load.expected[i], answers[i]) for i in range(len(LOAD))]
    mixed = [(i, got) for i, got in load.answers if got not in by_model[i]]
    load.report("two-model roll under load")
    TIMINGS.count("real pods: two-model roll under load: answers matching neither model", len(mixed))
    TIMINGS.count("real pods: two-model roll under load: answers by the second model", by_the_second_model())
    assert not load.failed and not mixed, (load.failed, mixed)
    assert by_the_second_model() < len(load.answers), "both models answered while the load ran"


def test_describe_shows_the_operators_events_and_logs_show_each_launcher(epd: RealEPD) -> None:
    described = epd.kubectl.run("describe", c.PLURAL, "-n", epd.namespace, epd.name)
    events = described.split("Events:", 1)[1]
    assert "<none>" not in events[:50] and "epd-operator" in events, described[-2000:]
    for role in (Role.ENCODER, Role.PREFILL, Role.DECODE, Role.PROXY):
        assert f"epd-launch[{role.value}]: exec" in epd.log(role), workload(epd.name, role)


def test_deleting_the_epddeployment_removes_every_child_and_container(epd: RealEPD, real_cluster: RealCluster) -> None:
    epd.forwards.close()
    epd.kubectl.run("delete", c.PLURAL, "-n", epd.namespace, epd.name, "--wait=true", "--timeout=120s")
    selector = f"{c.LABEL_INSTANCE}={epd.name}"

    def gone(kind: str) -> bool:
        return not epd.kubectl.json("get", kind, "-n", epd.namespace, "-l", selector)["items"]

    for kind in ("deployments", "statefulsets", "services", "configmaps", "pods"):
        eventually(functools.partial(gone, kind), f"every {kind} of {epd.name} gone", 180)
    eventually(
        lambda: not nodehost.pod_containers(real_cluster.local.node_files, epd.namespace),
        f"no container of {epd.namespace} pods left in containerd",
        120,
    )
