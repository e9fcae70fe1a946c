"""vLLM's CPU paged attention on this machine's CPU, one decode step in a fresh process (amx_attention_probe.py):
the crash of issue 11 at its smallest, its cause and its cure, in seconds instead of a deployment.

- The portable kernels, and the ones vLLM chooses on this CPU, equal a float32 attention computed by torch
  (within bf16 rounding). vLLM's choice runs after cpu_amx_tiles' permission request, as its worker runs it with
  the plugin: on an AMX CPU that is "amx" and the fix; elsewhere it is "vec".
- Without the request the "amx" kernel dies of SIGILL at its first tile instruction on every CPU whose vLLM build
  has it (avx512_bf16: the full `_C`): on an AMX CPU because Linux has not given the process AMX tile state (the
  cause), elsewhere because the CPU has no AMX (so the probe does reach the tile instructions, and the AMX
  machine's pass above means something). On a CPU without avx512_bf16 vLLM loads a build with no "amx" kernel,
  which refuses the ISA with an error before any tile instruction.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import REPO
from tests.e2e.cpu import cpu_summary, has_amx_tiles, loads_vllm_c

pytestmark = pytest.mark.e2e

PROBE = REPO / "tests" / "e2e" / "amx_attention_probe.py"
BF16_TOLERANCE = 0.02
"""Largest difference from the float32 reference allowed: bf16 keeps 8 bits of mantissa (measured: 0.0019)."""


def probe(python: Path, isa: str, *, request_permission: bool) -> tuple[int, list[dict[str, Any]], str]:
    argv = [str(python), str(PROBE), isa] + (["--request-permission"] if request_permission else [])
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return result.returncode, lines, result.stderr[-3000:]


@pytest.mark.parametrize("isa", ["vec", "vec16"])
def test_the_portable_attention_kernels_equal_a_float32_attention(e2e_python: Path, isa: str) -> None:
    code, lines, stderr = probe(e2e_python, isa, request_permission=True)
    assert code == 0, f"the {isa} probe exited with {code}: {lines}\n{stderr}"
    assert lines[-1]["max_abs_error"] < BF16_TOLERANCE, lines


def test_the_kernels_vllm_chooses_on_this_cpu_equal_a_float32_attention(e2e_python: Path) -> None:
    """ "amx" on a CPU with AMX tiles, after cpu_amx_tiles' permission request (the fix), "vec" elsewhere."""
    code, lines, stderr = probe(e2e_python, "chosen", request_permission=True)
    assert code == 0, f"the probe of vLLM's choice exited with {code}: {lines}\n{stderr}"
    want = "amx" if has_amx_tiles() else "vec"
    assert lines[-1]["isa"] == want, lines
    assert lines[0]["permission"].startswith("granted" if want == "amx" else "not granted"), lines
    assert lines[-1]["max_abs_error"] < BF16_TOLERANCE, lines


@pytest.mark.skipif(not loads_vllm_c(), reason=f"vLLM's CPU build here has no amx kernel ({cpu_summary()})")
def test_without_the_permission_request_the_amx_kernel_dies_of_sigill(e2e_python: Path) -> None:
    code, lines, stderr = probe(e2e_python, "amx", request_permission=False)
    assert {"isa": "amx", "attention": "starting"} in lines, f"the probe failed before the kernel: {stderr}"
    assert code == -signal.SIGILL, f"the amx kernel without AMX permission ended with {code}: {lines}\n{stderr}"


@pytest.mark.skipif(loads_vllm_c(), reason=f"vLLM's CPU build here has the amx kernel ({cpu_summary()})")
def test_a_vllm_build_without_the_amx_kernel_refuses_it_with_an_error(e2e_python: Path) -> None:
    """_C_AVX2 and _C_AVX512 have no "amx" attention: asked for it, they raise instead of crashing."""
    code, lines, stderr = probe(e2e_python, "amx", request_permission=False)
    assert code == 1, f"the amx probe on a build without it ended with {code}: {lines}\n{stderr}"
    assert "Unsupported CPU attention configuration" in stderr, stderr
    assert {"isa": "amx", "attention": "starting"} not in lines, lines
