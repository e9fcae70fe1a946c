"""The tiny Qwen2-VL is the same bytes on every build (tools/tinymodel/make_tiny_qwen2vl.py)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.tiny_model import SCRIPT as TINY_MODEL_SCRIPT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

EXPECTED_WEIGHTS_SHA256 = "2709976186fe73fc434a873e835590cd4a3e5e6efbd1397cf539ae7dc9a53508"
"""model.safetensors as built with the torch and transformers pinned in hack/requirements-e2e.txt. A change
means the script or a library changed what it writes: check that, then update the constant deliberately."""


def test_rebuilding_the_tiny_model_gives_the_same_bytes(e2e_python: Path, tiny_model: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [str(e2e_python), str(TINY_MODEL_SCRIPT), "--quiet", "--hashes", "--out", str(tmp_path / "again")],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    rebuilt: dict[str, str] = json.loads(result.stdout.strip().splitlines()[-2])
    cached = {name: hashlib.sha256((tiny_model / name).read_bytes()).hexdigest() for name in rebuilt}
    assert rebuilt == cached
    assert rebuilt["model.safetensors"] == EXPECTED_WEIGHTS_SHA256
    expected_files = {"config.json", "tokenizer.json", "preprocessor_config.json", "video_preprocessor_config.json"}
    assert expected_files <= set(rebuilt)
