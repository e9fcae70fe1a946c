"""epd-launch reads the model's config.json and refuses a store-sharing bundle whose store TP the model's KV
head count is no multiple of (vLLM then keys blocks per TP size and shares none). Through the real epd-launch
entry point as a subprocess (a dry run: no vLLM starts), with the tiny model's real config.json and variants of
it written into tmp_path. In the e2e tier because that tier builds the tiny model."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.unit.connectors.conftest import sample_bundle_data

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

EPD_LAUNCH = Path(sys.executable).parent / "epd-launch"


def model_dir(tiny_model: Path, tmp_path: Path, text: dict[str, Any] | None = None, flat: bool = False) -> Path:
    """A model folder holding the tiny model's config.json (text_config.num_key_value_heads 1,
    num_attention_heads 2) with these text_config values (None removes a key; flat: the text config's keys at
    the top level, as a text-only model has them)."""
    config = json.loads((tiny_model / "config.json").read_text())
    config["text_config"].update(text or {})
    config["text_config"] = {k: v for k, v in config["text_config"].items() if v is not None}
    if flat:
        config = {**{k: v for k, v in config.items() if k != "text_config"}, **config["text_config"]}
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def store_bundle(model: Path | str, role: str, tp: int, prefill_tp_sizes: list[int] | None) -> dict[str, Any]:
    """The sample PD bundle turned into a prefill or decode sharing the store with these prefill TP sizes."""
    data = copy.deepcopy(sample_bundle_data()["pd"])
    data["role"] = role
    data["vllm"].update(role=role, model=str(model), tensor_parallel_size=tp)
    if role == "decode":
        del data["ec_transfer"]
    extra: dict[str, Any] = {"cache_prefix": "kv-1"}
    if prefill_tp_sizes is not None:
        extra.update(enable_store_tp_lcm=True, prefill_tp_sizes=prefill_tp_sizes)
    data["kv_transfer"] = {
        "kv_connector": "MooncakeStoreConnector",
        "kv_role": "kv_both" if role == "prefill" else "kv_consumer",
        "kv_connector_extra_config": extra,
    }
    return data


def launch(tmp_path: Path, data: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(data))
    return subprocess.run(
        [str(EPD_LAUNCH), data["role"], "--bundle", str(path), "--workdir", str(tmp_path / "w"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("text", "flat", "role", "tp", "sizes", "count", "key", "store_tp"),
    [
        ({"num_key_value_heads": 3}, False, "prefill", 1, [1, 2], 3, "text_config.num_key_value_heads", 2),
        ({"num_key_value_heads": 3}, False, "decode", 2, [1, 2], 3, "text_config.num_key_value_heads", 2),
        ({"num_key_value_heads": 2}, True, "prefill", 2, [2, 4], 2, "num_key_value_heads", 4),
        # No KV key (MHA): the attention heads count; a decode of TP 2 under a prefill of TP 4 is mixed TP.
        (
            {"num_key_value_heads": None, "num_attention_heads": 6},
            False,
            "decode",
            2,
            [4],
            6,
            "text_config.num_attention_heads",
            4,
        ),
    ],
)
def test_a_head_count_the_store_tp_does_not_divide_exits_1_with_one_line(
    tiny_model: Path,
    tmp_path: Path,
    *,
    text: dict[str, Any],
    flat: bool,
    role: str,
    tp: int,
    sizes: list[int],
    count: int,
    key: str,
    store_tp: int,
) -> None:
    model = model_dir(tiny_model, tmp_path, text, flat)
    result = launch(tmp_path, store_bundle(model, role, tp, sizes))
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"epd-launch[{role}]: cannot start: model {model} has {count} KV heads ({key} in config.json), not a "
        f"multiple of the store TP {store_tp} (the LCM of prefill_tp_sizes {sorted(sizes)}; this instance runs TP "
        f"{tp}), so vLLM's MooncakeStoreConnector would key KV blocks per TP size and share none between them. "
        f"Fix: give every prefill pool a TP that divides {count} (decode TPs divide their LCM), or run every "
        "prefill and decode at one TP size"
    ]


@pytest.mark.parametrize(
    ("text", "role", "tp", "sizes"),
    [
        (None, "prefill", 1, [1, 2]),  # the tiny model itself: one KV head, vLLM's replicated MQA layout
        ({"num_key_value_heads": 4}, "prefill", 1, [1, 2]),
        ({"num_key_value_heads": 4}, "decode", 4, [2, 4]),
        ({"num_key_value_heads": 2}, "prefill", 4, [4]),  # one TP everywhere: the fallback keys alike
        ({"num_key_value_heads": 3}, "prefill", 1, None),  # no store TP asked for: rank-local keys by design
    ],
)
def test_a_fitting_or_unasked_head_count_starts(
    tiny_model: Path, tmp_path: Path, *, text: dict[str, Any] | None, role: str, tp: int, sizes: list[int] | None
) -> None:
    model = tiny_model if text is None else model_dir(tiny_model, tmp_path, text)
    result = launch(tmp_path, store_bundle(model, role, tp, sizes))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["argv"][2] == "vllm.entrypoints.openai.api_server"


def test_a_model_without_a_local_config_is_left_to_vllm(tmp_path: Path) -> None:
    result = launch(tmp_path, store_bundle("Qwen/Qwen2-VL-2B-Instruct", "prefill", 1, [1, 2]))
    assert result.returncode == 0, result.stderr
