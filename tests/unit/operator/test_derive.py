"""The derived values: stable, valid where Mooncake and Kubernetes have rules, and changing exactly when
their inputs do."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epd_connectors.config.master import MasterConfig
from epd_connectors.config.mooncake import TENANT_RE
from epd_connectors.config.vllm import DEFAULT_VLLM_VERSION
from epd_operator.api.model import ModelSpec
from epd_operator.api.spec import PrefillSpec
from epd_operator.derive import identity, parallel, ports, quantity
from epd_operator.derive.names import Names, name_problems

pytestmark = pytest.mark.unit

V = DEFAULT_VLLM_VERSION


def model(**overrides: Any) -> ModelSpec:
    data: dict[str, Any] = {
        "name": "Qwen/Qwen2-VL-7B-Instruct",
        "revision": "r1",
        "source": {"pvc": {"claimName": "w"}},
    }
    return ModelSpec.model_validate({**data, **overrides})


def test_a_new_revision_changes_both_prefixes() -> None:
    old, new = model(revision="r1"), model(revision="r2")
    assert identity.embedding_cache_prefix(old, vllm=V) != identity.embedding_cache_prefix(new, vllm=V)
    assert identity.kv_cache_prefix(old, vllm=V) != identity.kv_cache_prefix(new, vllm=V)


def test_dtype_and_where_the_weights_are_change_both_prefixes() -> None:
    base = model()
    others = (
        model(dtype="float16"),
        model(source={"image": {"reference": "reg/w@sha256:" + "a" * 64}}),
        model(source={"pvc": {"claimName": "w2"}}),
        model(source={"hostPath": {"path": "/models/w"}}),
    )
    for other in others:
        assert identity.embedding_cache_prefix(base, vllm=V) != identity.embedding_cache_prefix(other, vllm=V)
        assert identity.kv_cache_prefix(base, vllm=V) != identity.kv_cache_prefix(other, vllm=V)


def test_processor_kwargs_change_the_embedding_prefix_only() -> None:
    base, other = model(), model(mmProcessorKwargs={"max_pixels": 1024})
    assert identity.embedding_cache_prefix(base, vllm=V) != identity.embedding_cache_prefix(other, vllm=V)
    assert identity.kv_cache_prefix(base, vllm=V) == identity.kv_cache_prefix(other, vllm=V)


def test_the_model_revision_changes_with_anything_that_changes_outputs_and_is_a_label_value() -> None:
    base = identity.model_revision(model(), vllm=V)
    assert base == identity.model_revision(model(), vllm=V) and re.fullmatch(r"[0-9a-f]{16}", base)
    others = [
        model(revision="r2"),
        model(dtype="float16"),
        model(mmProcessorKwargs={"max_pixels": 1024}),
        model(source={"pvc": {"claimName": "w2"}}),
        model(source={"hostPath": {"path": "/models/w"}}),
        model(name="Qwen/Qwen2-VL-2B-Instruct"),
    ]
    assert len({base, *(identity.model_revision(m, vllm=V) for m in others)}) == len(others) + 1
    assert identity.model_revision(model(servedModelName="vl"), vllm=V) == base  # a name for clients, not the weights


def test_prefixes_are_stable_valid_and_distinct_per_kind() -> None:
    emb, kv = identity.embedding_cache_prefix(model(), vllm=V), identity.kv_cache_prefix(model(), vllm=V)
    assert emb == identity.embedding_cache_prefix(model(), vllm=V) and kv == identity.kv_cache_prefix(model(), vllm=V)
    assert emb.startswith("emb-") and kv.startswith("kv-") and emb[4:] != kv[3:]
    assert not any(ch in emb + kv for ch in "@ \t")


def test_an_override_wins() -> None:
    assert identity.embedding_cache_prefix(model(), "mine", vllm=V) == "mine"
    assert identity.kv_cache_prefix(model(), "kv-mine", vllm=V) == "kv-mine"


def test_embedding_model_identity_has_no_key_delimiter() -> None:
    assert identity.embedding_model_identity(model(name="org/m@x")) == "org/m_x"


def test_store_tp_is_the_lcm_of_prefill_tp_sizes() -> None:
    assert parallel.store_tp_size((1, 2, 4)) == 4
    assert parallel.store_tp_size((2, 3)) == 6
    prefill = PrefillSpec.model_validate(
        {
            "tensorParallelSize": 2,
            "kv": {"connector": "mooncake-store"},
            "additionalPools": [
                {"name": "a", "tensorParallelSize": 4},
                {"name": "b", "tensorParallelSize": 1},
                {"name": "c", "tensorParallelSize": 2},
            ],
        }
    )
    assert parallel.prefill_tp_sizes(prefill) == (1, 2, 4)


def test_tenant_id_is_readable_stable_and_valid() -> None:
    assert identity.tenant_id(None, "serving", "qwen") == "serving.qwen"
    # A namespace never holds a dot, so the pair is unambiguous where a dash would not be.
    assert identity.tenant_id(None, "team-a", "vl") != identity.tenant_id(None, "team", "a-vl")
    assert identity.tenant_id("team-a", "serving", "qwen") == "team-a"
    long_ns, long_name = "n" * 63, "x" * 200
    derived = identity.tenant_id(None, long_ns, long_name)
    assert derived == identity.tenant_id(None, long_ns, long_name)
    assert len(derived) <= identity.TENANT_MAX_LEN and TENANT_RE.match(derived)
    assert derived != identity.tenant_id(None, long_ns, long_name + "y")


_LABEL = st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
_SUBDOMAIN = st.lists(_LABEL, min_size=1, max_size=4).map(".".join).filter(lambda s: len(s) <= 253)


@settings(max_examples=100, deadline=None)
@given(namespace=_LABEL, name=_SUBDOMAIN)
def test_any_kubernetes_name_gives_a_valid_tenant_id(namespace: str, name: str) -> None:
    derived = identity.tenant_id(None, namespace, name)
    assert TENANT_RE.match(derived) and len(derived) <= identity.TENANT_MAX_LEN
    assert derived == identity.tenant_id(None, namespace, name)


def test_hash_seed_is_stable_in_range_and_per_deployment() -> None:
    seed = identity.python_hash_seed("serving", "qwen")
    assert seed == identity.python_hash_seed("serving", "qwen")
    assert 0 <= seed <= 2**32 - 1
    assert seed != identity.python_hash_seed("serving", "qwen2")
    assert seed != identity.python_hash_seed("other", "qwen")


def test_ec_control_ports_one_per_tp_rank_without_collisions() -> None:
    found = ports.vllm_ports(tensor_parallel_size=4, ec_consumer=True, kv_bootstrap=True)
    assert [found[ports.ec_port_name(r)] for r in range(4)] == [14579, 14580, 14581, 14582]
    assert found[ports.HTTP] == 8000 and found[ports.BOOTSTRAP] == 8998
    assert ports.collisions(found, "x") == []
    assert ports.collisions({"a": 1, "b": 1}, "spec.f") == [
        "spec.f = 1: used by a and b in the same pod. Fix: choose another port"
    ]


def test_addresses_use_service_dns_names() -> None:
    names, master = Names("qwen", "serving"), MasterConfig()
    assert names.master_address(master) == "qwen-master.serving.svc:50051"
    assert names.master_health_url(master) == "http://qwen-master.serving.svc:9003/health"
    assert names.master_metrics_url(master) == "http://qwen-master.serving.svc:9003/metrics"
    assert names.metadata_server(MasterConfig(enable_http_metadata_server=True)) == (
        "http://qwen-master.serving.svc:8080/metadata"
    )
    assert names.proxy_url(80) == "http://qwen-proxy.serving.svc:80"


def test_names_kubernetes_would_refuse_are_reported_with_the_room_left() -> None:
    names = Names("a" * 50, "ns")
    problems = name_problems(names, [names.workload("prefill", "pool-x")], [names.workload("store-client")])
    assert len(problems) == 2 and all(p.startswith("metadata.name = ") for p in problems)
    assert name_problems(Names("ok", "ns"), ["ok-encoder"], ["ok-store-client"]) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4G", 4 * 10**9), ("4Gi", 4 * 2**30), (1024, 1024), ("1.5Ki", 1536), ("1e3", 1000), ("x", None), ("4Q", None)],
)
def test_memory_quantities_follow_kubernetes(text: str | int, expected: int | None) -> None:
    assert quantity.memory_bytes(text) == expected


def test_memory_floor_keeps_a_larger_user_value() -> None:
    assert quantity.at_least("100Gi", 5 * quantity.GI) == "100Gi"
    assert quantity.at_least("4G", 5 * quantity.GI) == "5Gi"
    assert quantity.at_least(None, 5 * quantity.GI + 1) == str(5 * quantity.GI + 1)


def test_the_vllm_version_is_part_of_every_identity() -> None:
    """0.33 and 0.34 name their cross-encoder keys differently and lay out KV differently: no shared entries, and
    a version change is a new revision (rolled as a model change is)."""
    for derive in (identity.embedding_cache_prefix, identity.kv_cache_prefix, identity.model_revision):
        assert derive(model(), vllm="0.33") != derive(model(), vllm="0.34")
