"""Every example and a bounded set of variants, rendered by the operator, judged by vLLM's own code (both pins).

Each vLLM role's argv goes through vLLM's FlexibleArgumentParser + make_arg_parser, EngineArgs.from_cli_args and
create_engine_config (ECTransferConfig, KVTransferConfig), MooncakeECConfig.from_vllm_config for an
ECMooncakeConnector, and its mooncake_config.json through vLLM's MooncakeStoreConfig.from_file. Known-bad cases
run in the same checker call and must be refused at the stage they target, so a checker that cannot fail would
fail here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.vllm import rendered
from tests.vllm.conftest import Vllm

pytestmark = pytest.mark.vllm

BASE = "local-e-p-d"
"""The example the known-bad cases start from (every stage applies: EC producer, KV configs, Mooncake JSON)."""


def _bad_cases(good: dict[str, rendered.Case], workdir: Path, checker: str) -> dict[str, tuple[rendered.Case, str]]:
    """Known-bad variants of rendered cases, each with the checker stage that must refuse it."""
    encoder, prefill = good[f"{BASE}/demo-encoder"], good[f"{BASE}/demo-prefill"]
    bad_json = workdir / "bad-mooncake.json"
    config = json.loads(Path(prefill["mooncake_config"]).read_text())
    bad_json.write_text(json.dumps({**config, "mode": "sideways"}))
    kv = json.dumps({"kv_connector": "MooncakeConnector", "kv_role": "kv_sideways"})

    def changed(base: rendered.Case, name: str, **fields: Any) -> rendered.Case:
        return {**base, "name": name, **fields}

    removed = {}
    if checker.startswith(rendered.V2_ONLY):  # the switch 0.34 removed, set as 0.33 understood it
        env = {**prefill["env"], "VLLM_USE_V2_MODEL_RUNNER": "0"}
        removed["the V1 runner asked of 0.34"] = (changed(prefill, "bad/v1-runner", env=env), "create_engine_config")
    return removed | {
        "unknown flag": (changed(prefill, "bad/unknown-flag", argv=[*prefill["argv"], "--no-such-flag"]), "parse"),
        "non-numeric TP": (changed(prefill, "bad/tp", argv=[*prefill["argv"], "-tp", "two"]), "parse"),
        "unknown kv_role": (
            changed(prefill, "bad/kv-role", argv=[*prefill["argv"], "--kv-transfer-config", kv]),
            "parse",
        ),
        "EC producer with TP 2": (
            changed(encoder, "bad/ec-producer-tp2", argv=[*encoder["argv"], "--tensor-parallel-size", "2"]),
            "mooncake_ec_config",
        ),
        "unknown Mooncake mode": (
            changed(prefill, "bad/mooncake-mode", mooncake_config=str(bad_json)),
            "mooncake_store_config",
        ),
    }


@pytest.fixture(scope="module")
def judged(vllm: Vllm, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The checker's verdict on every rendered case and every known-bad one, in one vLLM process."""
    workdir = tmp_path_factory.mktemp(f"vllm-{vllm.version}")
    good: dict[str, rendered.Case] = {}
    refused_by_operator: list[str] = []
    for name, spec in rendered.specs(vllm.version):
        found = rendered.cases(name, spec, model=tiny_model, workdir=workdir)
        if not found:
            refused_by_operator.append(name)
        good.update({case["name"]: case for case in found})
    bad = _bad_cases(good, workdir, vllm.version)
    answer = vllm.run({"op": "check", "cases": [*good.values(), *(case for case, _ in bad.values())]})
    results = {result["name"]: result for result in answer["results"]}
    return {"good": good, "bad": bad, "results": results, "refused_by_operator": refused_by_operator}


def test_every_rendered_argv_and_config_is_accepted_by_vllm(vllm: Vllm, judged: dict[str, Any]) -> None:
    results = judged["results"]
    examples = rendered.judged_examples(vllm.version)
    assert all(any(name.startswith(f"{example}/") for name in judged["good"]) for example in examples)
    # 0.34 judges every example rendered for it; an older vLLM every example but the one written for 0.34.
    left_out = set() if vllm.version.startswith(rendered.V2_ONLY) else {"e-p-d-vllm034"}
    assert set(rendered.examples()) - set(examples) == left_out
    # The variants must mostly render (a variant list the operator refuses wholesale would judge nothing).
    assert len(judged["good"]) > 5 * len(examples), sorted(judged["good"])
    refused = {
        name: f"{results[name]['stage']}: {results[name]['error']}"
        for name in judged["good"]
        if not results[name]["ok"]
    }
    assert not refused, "vLLM refuses what the operator rendered:\n" + "\n".join(
        f"{k}: {v}" for k, v in refused.items()
    )


def test_every_checker_stage_refuses_a_known_bad_case(judged: dict[str, Any]) -> None:
    results = judged["results"]
    for label, (case, stage) in judged["bad"].items():
        result = results[case["name"]]
        assert not result["ok"], f"vLLM accepted the known-bad case {label!r}: {case['argv'][-3:]}"
        assert result["stage"] == stage, f"{label}: refused at {result['stage']} ({result['error']}), not {stage}"
