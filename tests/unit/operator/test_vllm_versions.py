"""What render gives each vLLM version (spec.images.vllmVersion, else the operator's default): the runner switch
only where it exists, the 0.34-only keys only on 0.34 (refused on 0.33, naming the field), and a version in every
cache prefix and the revision."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from epd_connectors.config.kv_transfer import MooncakeConnectorConfig, MooncakeStoreConnectorConfig, connectors_of
from epd_operator.api.resource import InvalidSpecError, OperatorDefaults, Owner, parse_spec
from epd_operator.render import Desired, render_desired
from tests.unit.operator.bundles import bundles_of

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "e-p-d-vllm034.yaml"
OWNER = Owner(name="vl", namespace="serving", uid="00000000-0000-4000-8000-000000000004")


def spec_034() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())["spec"]
    return spec


def as_033(spec: dict[str, Any]) -> dict[str, Any]:
    older = copy.deepcopy(spec)
    older["images"] = {"vllmVersion": "0.33"}
    return older


DEFAULTS = OperatorDefaults()


def render(spec: dict[str, Any], defaults: OperatorDefaults = DEFAULTS) -> Desired:
    return render_desired(OWNER, parse_spec(spec), defaults)


def test_on_0_34_the_new_keys_are_rendered_alike_on_both_sides_and_the_runner_switch_is_gone() -> None:
    built = bundles_of(render(spec_034()))
    encoder = built["vl-encoder"]
    assert encoder.vllm is not None and encoder.vllm.vllm_version == "0.34"
    assert "VLLM_USE_V2_MODEL_RUNNER" not in encoder.vllm.env()  # cross-encoder reuse on, no switch on 0.34
    for name in ("vl-prefill", "vl-decode"):
        kv = built[name].kv_transfer
        assert kv is not None
        children = connectors_of(kv)
        [p2p] = [x for x in children if isinstance(x, MooncakeConnectorConfig)]
        [store] = [x for x in children if isinstance(x, MooncakeStoreConnectorConfig)]
        assert p2p.kv_connector_extra_config.kv_lease_duration == 60.0, name
        assert store.kv_connector_extra_config.lookup_timeout_s == 0.5, name


def test_0_33_keeps_the_runner_switch_for_cross_encoder_reuse() -> None:
    older = as_033(spec_034())
    del older["store"]["kvLookupTimeoutSeconds"], older["prefill"]["kv"]["leaseDurationSeconds"]
    encoder = bundles_of(render(older))["vl-encoder"].vllm
    assert encoder is not None and encoder.env()["VLLM_USE_V2_MODEL_RUNNER"] == "1"


def test_a_0_34_key_on_0_33_is_refused_naming_the_field_and_the_fix() -> None:
    with pytest.raises(InvalidSpecError) as caught:
        render(as_033(spec_034()))
    problems = caught.value.problems
    assert len(problems) == 2, problems
    assert problems[0].startswith("spec.prefill.kv.leaseDurationSeconds = 60.0: vLLM 0.33 does not read it")
    assert problems[1].startswith("spec.store.kvLookupTimeoutSeconds = 0.5: vLLM 0.33 does not read it")
    assert all("spec.images.vllmVersion: '0.34'" in p for p in problems)
    # The operator's default version counts where the spec names none.
    unnamed = copy.deepcopy(spec_034())
    del unnamed["images"]["vllmVersion"]
    with pytest.raises(InvalidSpecError):
        render(unnamed)
    assert render(unnamed, OperatorDefaults(vllm_version="0.34")).derived.model_revision


def test_a_lease_needs_the_p2p_connector() -> None:
    spec = spec_034()
    spec["prefill"]["kv"]["connector"] = "mooncake-store"
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(spec)
    assert "spec.prefill.kv.leaseDurationSeconds = 60.0: is MooncakeConnector's (P2P)" in str(caught.value.problems)


def test_another_version_is_another_revision_and_other_cache_prefixes() -> None:
    newer = render(spec_034()).derived
    older_spec = as_033(spec_034())
    del older_spec["store"]["kvLookupTimeoutSeconds"], older_spec["prefill"]["kv"]["leaseDurationSeconds"]
    older = render(older_spec).derived
    assert newer.model_revision != older.model_revision
    assert newer.embedding_cache_prefix != older.embedding_cache_prefix
    assert newer.kv_cache_prefix != older.kv_cache_prefix
