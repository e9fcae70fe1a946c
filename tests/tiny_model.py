"""The tiny Qwen2-VL the e2e and vllm tiers serve or parse: built by tools/tinymodel with a vLLM virtualenv's
transformers, and cached (the script prints the folder; a rebuild happens only when the script changed)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "tinymodel" / "make_tiny_qwen2vl.py"


def build(python: Path, hint: str, seed: int | None = None) -> Path:
    """The tiny model's folder, built with `python` (a vLLM venv's); a test failure naming `hint` otherwise.
    `seed`: another model of the same shape whose answers differ (the script's --seed)."""
    result = subprocess.run(
        [str(python), str(SCRIPT), "--quiet", *(["--seed", str(seed)] if seed is not None else [])],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        check=False,
        timeout=600,
    )
    if result.returncode != 0:
        pytest.fail(f"building the tiny model failed ({hint}):\n{result.stderr[-4000:]}", pytrace=False)
    return Path(result.stdout.strip().splitlines()[-1])
