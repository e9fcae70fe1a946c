"""The entry point's settings (flags over environment), kopf's configuration, the handler registry (nothing that
needs a finalizer), and the metrics' bookkeeping."""

from __future__ import annotations

import random

import kopf
import pytest
from prometheus_client import CollectorRegistry

from epd_operator import apply, handlers, main, settings
from epd_operator.api.resource import OperatorDefaults, OperatorPeer
from epd_operator.controller import CHILD_SELECTOR, MODEL_POD_SELECTOR
from epd_operator.metrics import Metrics

pytestmark = pytest.mark.unit


def parse(*argv: str, **env: str) -> settings.Settings:
    return settings.parse(list(argv), env)


def test_namespaces_are_repeatable_and_peering_is_off_by_default() -> None:
    s = parse("-n", "a", "--namespace", "b")
    assert s.namespaces == ("a", "b") and not s.all_namespaces
    assert s.peering is None
    assert s.liveness == settings.DEFAULT_LIVENESS
    assert s.metrics_port == settings.DEFAULT_METRICS_PORT
    assert s.defaults == OperatorDefaults()


def test_environment_fills_what_flags_leave_out_and_flags_win() -> None:
    env = {
        "EPD_OPERATOR_NAMESPACES": "x, y",
        "EPD_OPERATOR_VLLM_IMAGE": "reg/vllm:env",
        "EPD_OPERATOR_PROXY_IMAGE": "reg/proxy:env",
        "EPD_OPERATOR_METRICS_PORT": "9999",
        "EPD_OPERATOR_PEERING": "epd",
        "KUBECONFIG": "/k",
    }
    s = parse("--proxy-image", "reg/proxy:flag", **env)
    assert s.namespaces == ("x", "y")
    assert s.defaults.vllm_image == "reg/vllm:env"
    assert s.defaults.proxy_image == "reg/proxy:flag"
    assert s.defaults.mooncake_image == OperatorDefaults().mooncake_image
    assert (s.metrics_port, s.peering, s.connection.kubeconfig) == (9999, "epd", "/k")
    assert parse("-n", "z", **env).namespaces == ("z",)


def test_the_default_vllm_version_and_the_prometheus_come_from_flags_or_environment() -> None:
    assert parse("-n", "a", "--vllm-version", "0.34").defaults.vllm_version == "0.34"
    s = parse("-n", "a", EPD_OPERATOR_VLLM_VERSION="0.32", EPD_OPERATOR_PROMETHEUS_URL="http://p:9090")
    assert (s.defaults.vllm_version, s.defaults.prometheus_url) == ("0.32", "http://p:9090")
    with pytest.raises(settings.SettingsError, match=r"'0\.35' is not one of 0\.32, 0\.33, 0\.34"):
        parse("-n", "a", EPD_OPERATOR_VLLM_VERSION="0.35")
    with pytest.raises(SystemExit):  # argparse's choices
        parse("-n", "a", "--vllm-version", "0.35")


def test_all_namespaces_and_disabled_endpoints() -> None:
    s = parse("-A", "--liveness", "", "--metrics-port", "0")
    assert s.all_namespaces and s.namespaces == ()
    assert s.liveness is None and s.metrics_port == 0
    assert parse(EPD_OPERATOR_ALL_NAMESPACES="true").all_namespaces


def test_a_scope_is_required() -> None:
    with pytest.raises(settings.SettingsError, match="--namespace NS"):
        parse()
    with pytest.raises(settings.SettingsError, match="not both"):
        parse(EPD_OPERATOR_NAMESPACES="a", EPD_OPERATOR_ALL_NAMESPACES="1")
    assert parse("-A", EPD_OPERATOR_NAMESPACES="a").namespaces == ()  # flags replace the environment's scope
    with pytest.raises(SystemExit):
        parse("-n", "a", "-A")


def test_main_exits_2_without_a_scope(capsys: pytest.CaptureFixture[str]) -> None:
    assert main.main([]) == 2
    assert "--all-namespaces" in capsys.readouterr().err


def test_every_handler_is_an_event_handler_so_kopf_keeps_no_state_on_our_objects() -> None:
    # Change handlers make kopf write annotations and read a diff base; deletion handlers, daemons and timers make
    # it add a finalizer. Owner references do our cleanup, and the controller keeps its own state.
    for peering in (False, True):
        registry = handlers.registry(peering=peering)
        assert registry._changing.get_all_handlers() == []
        assert registry._spawning.get_all_handlers() == []
    diffbase = main.kopf_settings().persistence.diffbase_storage
    body = kopf.Body({"metadata": {"name": "x"}, "spec": {"big": list(range(1000))}})
    assert isinstance(diffbase, handlers.NoDiffBase) and diffbase.build(body=body) == {}


def test_kopf_watches_the_children_only_with_peering_which_pauses_its_watches() -> None:
    alone: list[object] = [h.fn for h in handlers.registry(peering=False)._watching.get_all_handlers()]
    assert alone == [handlers.deployment_event], "standalone: the controller watches the children itself"
    peered: list[object] = [h.fn for h in handlers.registry(peering=True)._watching.get_all_handlers()]
    assert peered == [
        handlers.deployment_event,
        *[handlers.child_event] * len(apply.MANAGED_KINDS),
        handlers.model_pod_event,
    ]
    selectors = list(main.kopf_settings().watching.label_selectors.values())
    assert selectors == [CHILD_SELECTOR] * len(apply.MANAGED_KINDS) + [MODEL_POD_SELECTOR], "filtered on the server"


def test_metrics_sum_over_deployments() -> None:
    m = Metrics(CollectorRegistry())

    def value(name: str, **labels: str) -> float | None:
        return m.registry.get_sample_value(name, labels)

    m.set_objects(("ns", "a"), {"Deployment": 3, "ConfigMap": 3})
    m.set_objects(("ns", "b"), {"Deployment": 2, "StatefulSet": 1})
    assert value("epd_operator_managed_objects", kind="Deployment") == 5
    m.forget(("ns", "b"))
    assert value("epd_operator_managed_objects", kind="Deployment") == 3
    assert value("epd_operator_managed_objects", kind="StatefulSet") == 0
    m.set_phase(("ns", "a"), "Ready")
    m.set_phase(("ns", "c"), "Invalid")
    assert value("epd_operator_deployments", phase="Ready") == 1
    assert value("epd_operator_deployments", phase="Pending") == 0
    m.forget(("ns", "c"))
    assert value("epd_operator_deployments", phase="Invalid") == 0
    m.reconciles.labels("changed").inc()
    m.duration.observe(0.02)
    assert value("epd_operator_reconciles_total", outcome="changed") == 1
    assert value("epd_operator_reconcile_duration_seconds_count") == 1


def test_the_operators_own_pods_and_the_store_reading_interval() -> None:
    s = parse("-A", "--pod-namespace", "epd-system", "--pod-labels", "app.kubernetes.io/name=epd-operator,x=y")
    assert s.defaults.operator_peer == OperatorPeer(
        "epd-system", (("app.kubernetes.io/name", "epd-operator"), ("x", "y"))
    )
    assert (
        s.store_poll_interval_s == settings.DEFAULT_STORE_POLL_INTERVAL_S and parse("-A").defaults.operator_peer is None
    )
    assert parse("-A", "--store-poll-interval", "0").store_poll_interval_s == 0
    assert s.transfer_poll_interval_s == settings.DEFAULT_TRANSFER_POLL_INTERVAL_S
    assert parse("-A", "--transfer-poll-interval", "0").transfer_poll_interval_s == 0
    with pytest.raises(settings.SettingsError, match="--pod-namespace NS and --pod-labels"):
        parse("-A", "--pod-namespace", "epd-system")
    with pytest.raises(settings.SettingsError, match="--pod-labels"):
        parse("-A", "--pod-namespace", "epd-system", "--pod-labels", "novalue")


def test_condition_gauges_follow_the_status_and_go_with_the_deployment() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.set_conditions(("ns", "a"), {"Ready": "False", "StoreReady": "True"})
    metrics.set_conditions(("ns", "b"), {"Ready": "True"})
    value = metrics.registry.get_sample_value
    assert value("epd_operator_condition", {"namespace": "ns", "name": "a", "type": "Ready"}) == 0
    assert value("epd_operator_condition", {"namespace": "ns", "name": "a", "type": "StoreReady"}) == 1
    metrics.forget(("ns", "a"))
    assert value("epd_operator_condition", {"namespace": "ns", "name": "a", "type": "Ready"}) is None
    assert value("epd_operator_condition", {"namespace": "ns", "name": "b", "type": "Ready"}) == 1


def test_each_replica_draws_its_own_peering_priority_unless_one_is_given() -> None:
    peered = parse("-n", "a", "--peering", "epd")
    assert peered.priority is None
    drawn = {main.peering_priority(peered, random.Random(seed)) for seed in range(20)}
    assert len(drawn) == 20 and all(main.PRIORITIES[0] <= p <= main.PRIORITIES[1] for p in drawn)
    given = parse("-n", "a", "--peering", "epd", "--priority", "7")
    assert main.peering_priority(given, random.Random(0)) == 7
    assert parse("-n", "a", **{"EPD_OPERATOR_PRIORITY": "9"}).priority == 9
