"""vLLM's own code judges what the operator renders, for each pinned vLLM version (0.32, 0.33, 0.34).

Each test runs tests/vllm/vllm_check.py inside a vLLM virtualenv as a subprocess, so .venv needs no vLLM:
.venv-e2e (vLLM 0.32, the CPU build; EPD_E2E_VENV), .venv-vllm033 (the PyPI vLLM 0.33.0 wheel the GPU images
run; EPD_VLLM033_VENV) and .venv-vllm034 (the PyPI 0.34.0 wheel over .venv-vllm033's packages; EPD_VLLM034_VENV).
With VLLM_TARGET_DEVICE=cpu their argument parser and create_engine_config work on a CPU (0.34's with Triton
stood in for: see vllm_check.py).

The tier is opt-in like e2e: its tests are deselected unless the run selects `vllm` (`pytest -m vllm`,
`make test-vllm`, `make test`) or names a path under tests/vllm.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.tiny_model import build as tiny_model_build

REPO = Path(__file__).resolve().parents[2]
CHECKER = Path(__file__).with_name("vllm_check.py")
CHECK_TIMEOUT_S = 900


def _venv(variable: str, default: str) -> Path:
    path = Path(os.environ.get(variable, default))
    return path if path.is_absolute() else REPO / path


@dataclass(frozen=True)
class Vllm:
    """One pinned vLLM: its virtualenv and how to set it up."""

    version: str
    venv: Path
    setup: str

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """The checker's answer to `request`, or a test failure with its output."""
        if not self.python.exists() or not (self.venv / ".epd-setup-stamp").exists():
            pytest.fail(
                f"{self.venv} (vLLM {self.version}) is missing or incomplete: run `{self.setup}`", pytrace=False
            )
        env = {
            **os.environ,
            "VLLM_TARGET_DEVICE": "cpu",
            "HF_HUB_OFFLINE": "1",
            # .venv-e2e's epd_connectors (vLLM plugins) is another checkout's editable install: run this one's.
            "PYTHONPATH": str(REPO / "connectors" / "src"),
        }
        result = subprocess.run(
            [str(self.python), str(CHECKER)],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            env=env,
            timeout=CHECK_TIMEOUT_S,
            check=False,
        )
        lines = result.stdout.strip().splitlines()
        if result.returncode != 0 or not lines:
            pytest.fail(f"the checker failed in {self.venv} (exit {result.returncode}):\n{result.stderr[-4000:]}")
        answer: dict[str, Any] = json.loads(lines[-1])
        assert answer["version"] == self.version, f"{self.venv} runs vLLM {answer['version']}, not {self.version}"
        return answer


VLLMS = (
    Vllm("0.32.0", _venv("EPD_E2E_VENV", ".venv-e2e"), "make setup-e2e"),
    Vllm("0.33.0", _venv("EPD_VLLM033_VENV", ".venv-vllm033"), "make setup-vllm033"),
    Vllm("0.34.0", _venv("EPD_VLLM034_VENV", ".venv-vllm034"), "make setup-vllm034"),
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect vllm tests unless the run asks for them (`-m` naming vllm, or a path under tests/vllm)."""
    markexpr = str(config.getoption("markexpr", "") or "")
    named = any("tests/vllm" in str(arg) for arg in config.args)
    if "vllm" in markexpr or named:
        return
    dropped = [item for item in items if item.get_closest_marker("vllm") is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item.get_closest_marker("vllm") is None]


@pytest.fixture(scope="session", params=VLLMS, ids=[v.version for v in VLLMS])
def vllm(request: pytest.FixtureRequest) -> Vllm:
    """Each pinned vLLM in turn."""
    found: Vllm = request.param
    return found


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny Qwen2-VL (built by `make setup-e2e` with .venv-e2e's transformers, cached; the script prints it)."""
    python = VLLMS[0].python
    if not python.exists():
        pytest.fail(f"{VLLMS[0].venv} is missing: run `{VLLMS[0].setup}`", pytrace=False)
    return tiny_model_build(python, f"run `{VLLMS[0].setup}`")
