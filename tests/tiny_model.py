"""The tiny Qwen2-VL the e2e and vllm tiers serve or parse: built by tools/tinymodel with a vLLM virtualenv's
transformers, and cached (the script prints the folder; a rebuild happens only when the script changed)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "tinymodel" / "make_tiny_qwen2vl.py"
AUDIO_SCRIPT = SCRIPT.with_name("make_tiny_qwen2audio.py")
"""The tiny Qwen2-Audio (the audio E+PD test's model)."""


def build(python: Path, hint: str, seed: int | None = None, script: Path = SCRIPT) -> Path:
    """The tiny model's folder, built with `python` (a vLLM venv's); a test failure naming `hint` otherwise.
    `seed`: another model of the same shape whose answers differ (the script's --seed); `script`: which model."""
    result = subprocess.run(
        [str(python), str(script), "--quiet", *(["--seed", str(seed)] if seed is not None else [])],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        check=False,
        timeout=600,
    )
    if result.returncode != 0:
        pytest.fail(f"building the tiny model failed ({hint}):\n{result.stderr[-4000:]}", pytrace=False)
    return Path(result.stdout.strip().splitlines()[-1])
