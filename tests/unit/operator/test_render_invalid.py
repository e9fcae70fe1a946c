"""Specs that cannot be deployed raise InvalidSpecError, with one problem per line naming the spec field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from epd_connectors.config import consistency
from epd_connectors.config.bundle import parse_bundle
from epd_operator.api.resource import InvalidSpecError, OperatorDefaults, Owner, parse_spec
from epd_operator.render import bundles_vllm, render_desired, validate

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
OWNER = Owner(name="demo", namespace="serving", uid="00000000-0000-4000-8000-000000000003")


def example(name: str) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())["spec"]
    return spec


def problems_of(spec: dict[str, Any], owner: Owner = OWNER) -> list[str]:
    with pytest.raises(InvalidSpecError) as caught:
        render_desired(owner, parse_spec(spec), OperatorDefaults())
    assert str(caught.value) == "; ".join(caught.value.problems)
    return caught.value.problems


@pytest.mark.parametrize(
    ("arg", "flag", "fix"),
    [
        ("--port=9000", "--port", "Services and probes"),
        ("--served_model_name", "--served-model-name", "spec.model.servedModelName"),
        ("-tp", "-tp", "spec.encoder.tensorParallelSize"),
        ("--block-size", "--block-size", "spec.model.blockSize"),
        ("--max-num-batched", "--max-num-batched-tokens", "spec.encoder.maxNumBatchedTokens"),
        ("--mm-processor-kwargs.max_pixels", "--mm-processor-kwargs", "spec.model.mmProcessorKwargs"),
        ("--config", "--config", "extraArgs themselves"),
    ],
)
def test_extra_args_may_not_set_a_rendered_vllm_flag(arg: str, flag: str, fix: str) -> None:
    spec = example("e-pd-shared-storage")
    spec["encoder"]["extraArgs"] = [arg, "1"]
    [problem] = problems_of(spec)
    assert problem.startswith(f"spec.encoder.extraArgs = {arg!r}: sets {flag}, ")
    assert fix in problem.split("Fix: ", 1)[1]


def test_an_owned_flag_of_the_prefill_pools_is_reported_once_at_the_prefill_field() -> None:
    spec = example("e-p-d-store-offload")
    spec["prefill"]["extraArgs"] = ["--kv-transfer", "{}"]
    [problem] = problems_of(spec)
    assert problem.startswith("spec.prefill.extraArgs = '--kv-transfer': sets --kv-transfer-config")
    assert "spec.prefill.kv.connector" in problem


def test_unowned_extra_args_pass_through_after_the_rendered_flags() -> None:
    spec = example("e-pd-shared-storage")
    spec["decode"] = {"extraArgs": ["--max-model-len", "8192", "--port-offset-is-not-a-flag"]}
    desired = render_desired(OWNER, parse_spec(spec), OperatorDefaults())
    pd = next(o for o in desired.objects if o["metadata"]["name"] == "demo-pd-bundle")
    assert parse_bundle(pd["data"]["bundle.json"]).vllm.extra_args[-3:] == (  # type: ignore[union-attr]
        "--max-model-len",
        "8192",
        "--port-offset-is-not-a-flag",
    )


def test_the_library_rule_is_the_backstop_and_names_the_spec_field() -> None:
    assert validate.locate("spec.decode", "extra_args: extra_args = '--x': would override") == (
        "spec.decode.extraArgs: extra_args: extra_args = '--x': would override"
    )
    assert validate.locate("spec.decode", "env.PYTHONHASHSEED = '0': owned").startswith("spec.decode.env: ")
    assert validate.locate("spec.decode", "vllm.port = 1: bad").startswith("spec.decode: ")


def test_env_may_not_set_a_launcher_owned_variable() -> None:
    spec = example("e-pd-mooncake-cross-encoder")
    spec["decode"]["env"] = {"PYTHONHASHSEED": "0"}
    [problem] = problems_of(spec)
    assert problem.startswith("spec.decode.env: ") and "PYTHONHASHSEED" in problem


def test_decode_tp_must_divide_the_store_tp() -> None:
    spec = example("e-p-d-store-offload")
    spec["decode"]["tensorParallelSize"] = 4
    [problem] = problems_of(spec)
    assert problem.startswith("spec.decode.tensorParallelSize = 4: ") and "store TP" in problem


def p2p_spec(connector: str, prefill_tps: list[int], decode_tp: int) -> dict[str, Any]:
    """The mixed-TP example with these prefill pools (the first is the main pool) and decode TP."""
    spec = example("e-p-d-store-offload")
    spec["prefill"]["kv"] = {"connector": connector}
    spec["prefill"]["tensorParallelSize"] = prefill_tps[0]
    spec["prefill"]["additionalPools"] = [
        {"name": f"pool{i}", "replicas": 1, "tensorParallelSize": tp} for i, tp in enumerate(prefill_tps[1:])
    ]
    spec["decode"]["tensorParallelSize"] = decode_tp
    if "store" not in connector:
        del spec["decode"]["kv"]["saveDecodeCache"]
    return spec


@pytest.mark.parametrize(
    ("connector", "prefill_tps", "decode_tp", "field", "tp"),
    [
        ("mooncake", [3], 2, "spec.prefill", 3),
        ("mooncake", [2, 3], 2, "spec.prefill.additionalPools[0]", 3),
        ("mooncake", [2, 3], 3, "spec.prefill", 2),
        ("mooncake+store", [2, 3], 2, "spec.prefill.additionalPools[0]", 3),
    ],
)
def test_p2p_kv_needs_one_tp_to_divide_the_other(
    connector: str, prefill_tps: list[int], decode_tp: int, field: str, tp: int
) -> None:
    [problem] = problems_of(p2p_spec(connector, prefill_tps, decode_tp))
    assert problem.startswith(
        f"{field}.tensorParallelSize = {tp} with spec.decode.tensorParallelSize = {decode_tp}: "
        f"spec.prefill.kv.connector {connector} hands KV over P2P (MooncakeConnector) only between TP sizes"
    ), problem
    assert f"Fix: give this pool a TP that divides or is a multiple of {decode_tp}" in problem


@pytest.mark.parametrize(
    ("connector", "prefill_tps", "decode_tp"),
    [
        ("mooncake", [2], 4),
        ("mooncake", [4], 2),
        ("mooncake", [1], 3),
        ("mooncake", [3], 1),
        ("mooncake", [1, 2, 4], 2),
        ("mooncake+store", [2, 3], 6),
        ("mooncake-store", [2, 3], 2),  # no P2P: the store shares blocks across these TPs
    ],
)
def test_p2p_kv_between_dividing_tp_sizes_renders(connector: str, prefill_tps: list[int], decode_tp: int) -> None:
    render_desired(OWNER, parse_spec(p2p_spec(connector, prefill_tps, decode_tp)), OperatorDefaults())


def test_the_library_refuses_p2p_bundles_of_unfit_tp_sizes() -> None:
    """The same rule over rendered bundles (hand-written bundles, or a render that skipped the spec rule)."""
    desired = render_desired(OWNER, parse_spec(p2p_spec("mooncake", [2, 4], 2)), OperatorDefaults())
    found = {
        o["metadata"]["name"]: parse_bundle(o["data"]["bundle.json"])
        for o in desired.objects
        if o["kind"] == "ConfigMap"
    }
    assert validate.deployment_problems(found) == []
    pool = found["demo-prefill-pool0-bundle"]
    assert pool.vllm is not None
    found["demo-prefill-pool0-bundle"] = pool.model_copy(
        update={"vllm": pool.vllm.model_copy(update={"tensor_parallel_size": 3})}
    )
    [problem] = validate.deployment_problems(found)
    assert problem.startswith(
        "spec.prefill.tensorParallelSize / spec.prefill.additionalPools[].tensorParallelSize / "
        "spec.decode.tensorParallelSize: demo-prefill-pool0-bundle.vllm.tensor_parallel_size = 3 and "
        "demo-decode-bundle.vllm.tensor_parallel_size = 2: MooncakeConnector hands KV over only"
    ), problem


def test_a_consistency_disagreement_is_refused_naming_the_deciding_field(monkeypatch: pytest.MonkeyPatch) -> None:
    real = bundles_vllm.server_config

    def skewed(ctx: Any, unit: Any) -> Any:  # one role's seed drifts, as a render bug would make it
        server = real(ctx, unit)
        return server.model_copy(update={"python_hash_seed": 1}) if unit.role == "encoder" else server

    monkeypatch.setattr(bundles_vllm, "server_config", skewed)
    [problem] = problems_of(example("e-pd-mooncake-cross-encoder"))
    assert problem.startswith("spec.<role>.env: PYTHONHASHSEED differs between bundles: ")
    assert "demo-encoder.vllm.python_hash_seed = 1" in problem


def test_deployment_problems_map_each_topic_to_its_spec_field() -> None:
    desired = render_desired(OWNER, parse_spec(example("e-pd-mooncake-cross-encoder")), OperatorDefaults())
    found = {
        o["metadata"]["name"]: parse_bundle(o["data"]["bundle.json"])
        for o in desired.objects
        if o["kind"] == "ConfigMap"
    }
    assert validate.deployment_problems(found) == []
    pd = found["demo-pd-bundle"]
    assert pd.mooncake is not None
    found["demo-pd-bundle"] = pd.model_copy(update={"mooncake": pd.mooncake.model_copy(update={"tenant_id": "other"})})
    problems = validate.deployment_problems(found)
    assert problems[0].startswith("spec.store.tenant.id: tenant id differs between bundles")
    assert "demo-pd-bundle.mooncake.tenant_id = 'other'" in problems[0]
    # The isolating master admits only the deployment's tenant, which is decided by the same field.
    assert problems[1:] and all(p.startswith("spec.store.tenant.id: ") and "quota policy" in p for p in problems[1:])


def test_ha_masters_need_an_etcd_and_no_metadata_server() -> None:
    spec = example("e-pd-mooncake-cross-encoder")
    spec["store"]["master"] = {"ha": {"replicas": 2}}
    [problem] = problems_of(spec)
    assert problem.startswith("spec.store.master.ha.etcdEndpoints")
    spec["store"]["master"] = {"ha": {"etcdEndpoints": ["etcd:2379"]}, "httpMetadataServer": True}
    [problem] = problems_of(spec)
    assert problem.startswith("spec.store.master.httpMetadataServer = True") and "Fix: leave" in problem
    spec["store"]["master"] = {"ha": {"etcdEndpoints": ["etcd:99999"]}}
    [problem] = problems_of(spec)
    assert "ha.endpoints[]" in problem and "99999" in problem


def test_prefill_pool_names_are_unique_and_not_main() -> None:
    spec = example("e-p-d-store-offload")
    spec["prefill"]["additionalPools"] += [{"name": "tp2", "tensorParallelSize": 2}]
    assert [p.split(" = ")[0] for p in problems_of(spec)] == ["spec.prefill.additionalPools[1].name"]
    # "main" (the main pool's label) is one of the reserved words the API model refuses.
    spec["prefill"]["additionalPools"][1] = {"name": "main", "tensorParallelSize": 1}
    [problem] = problems_of(spec)
    assert problem.startswith("spec.prefill.additionalPools.1.name = 'main'") and "reserved" in problem


def test_a_name_too_long_for_its_services_is_refused() -> None:
    owner = Owner(name="x" * 60, namespace="serving", uid="u")
    problems = problems_of(example("e-pd-shared-storage"), owner)
    assert problems and all(p.startswith("metadata.name = ") for p in problems)


def test_gpu_counts_come_from_tensor_parallel_size() -> None:
    spec = example("e-p-d-store-offload")
    spec["decode"]["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    [problem] = problems_of(spec)
    assert problem.startswith("spec.decode.resources.limits[nvidia.com/gpu] = 1: ")


def test_save_decode_cache_needs_a_store_kv_connector() -> None:
    spec = example("e-p-d-store-offload")
    spec["prefill"]["kv"]["connector"] = "mooncake"
    [problem] = problems_of(spec)
    assert problem.startswith("spec.decode.kv.saveDecodeCache")


@pytest.mark.parametrize("value", ["retry", "Recompute", "", 1])
def test_an_unknown_kv_load_failure_policy_is_refused_naming_the_field(value: object) -> None:
    spec = example("e-p-d-store-offload")
    spec["decode"]["kv"]["loadFailurePolicy"] = value
    [problem] = problems_of(spec)
    assert problem.startswith(f"spec.decode.kv.loadFailurePolicy = {value!r}: ")
    assert "'recompute' or 'fail'" in problem


def test_the_crd_refuses_an_unknown_kv_load_failure_policy() -> None:
    """The API server's side of the same rule: an enum on the field, recompute by default."""
    crd = yaml.safe_load((Path(__file__).resolve().parents[3] / "crds" / "epddeployments.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    field = spec["properties"]["decode"]["properties"]["kv"]["properties"]["loadFailurePolicy"]
    assert field["enum"] == ["recompute", "fail"] and field["default"] == "recompute"
    assert "recompute" in field["description"] and "fail" in field["description"]


def test_store_client_port_may_not_take_its_metrics_port() -> None:
    spec = example("e-p-d-store-offload")
    spec["store"]["clients"]["port"] = 9300
    [problem] = problems_of(spec)
    assert problem.startswith("spec.store.clients.port = 9300: ")


def test_master_ports_may_not_collide() -> None:
    spec = example("e-pd-mooncake-cross-encoder")
    spec["store"]["master"] = {"metricsPort": 50051}
    [problem] = problems_of(spec)
    assert problem.startswith("spec.store.master ports = 50051")


def test_offload_needs_standalone_store_clients() -> None:
    spec = example("e-p-d-store-offload")
    spec["store"]["mode"] = "embedded"
    [problem] = problems_of(spec)
    assert problem.startswith("spec.store.clients.offload.enabled = True: embedded mode")


def test_a_quota_needs_isolation() -> None:
    spec = example("e-pd-mooncake-cross-encoder")
    spec["store"]["tenant"]["isolation"] = False
    [problem] = problems_of(spec)
    assert problem.startswith("spec.store.tenant.quota = ")


def test_every_deployment_rule_names_the_spec_field_that_decides_it() -> None:
    rules = {*consistency.AGREEMENT_TOPICS, consistency.RULE_STORE_OWNER, consistency.RULE_QUOTA_ADMISSION}
    rules.add(consistency.RULE_PROXY_ROSTER)
    rules.add(consistency.RULE_P2P_TP)
    assert rules <= set(validate.RULE_FIELDS), sorted(rules - set(validate.RULE_FIELDS))
    assert all(field.startswith("spec.") for field in validate.RULE_FIELDS.values())
