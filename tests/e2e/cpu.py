"""The CPU the tier runs on, as the tier prints it first: machines of the project's kind do not all have the same
CPU, and vLLM's CPU build picks its kernels by what the CPU reports (AMX tiles: the "amx" attention kernels)."""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
KERNEL_FLAGS = ("amx_bf16", "amx_tile", "amx_int8", "avx512f", "avx512_bf16", "avx512_vnni", "avx2")
"""The flags vLLM's CPU build and oneDNN choose kernels by."""


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The first processor's flags."""
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def has_amx_tiles(cpuinfo: str | None = None) -> bool:
    text = CPUINFO.read_text() if cpuinfo is None else cpuinfo
    return "amx_tile" in cpu_flags(text)


def loads_vllm_c(cpuinfo: str | None = None) -> bool:
    """Whether vLLM's CPU wheel loads its full `_C` build here, the one with the "amx" attention kernels: only
    on a CPU with avx512_bf16 (vllm/platforms/cpu.py import_kernels); elsewhere it loads _C_AVX512 or _C_AVX2."""
    text = CPUINFO.read_text() if cpuinfo is None else cpuinfo
    return {"avx512f", "avx512_bf16"} <= cpu_flags(text)


def cpu_summary(cpuinfo: str | None = None) -> str:
    """One line: the model name and which of KERNEL_FLAGS it has ("model ...; amx_tile yes, ...")."""
    text = CPUINFO.read_text() if cpuinfo is None else cpuinfo
    model = next(
        (line.partition(":")[2].strip() for line in text.splitlines() if line.startswith("model name")), "unknown"
    )
    flags = cpu_flags(text)
    return f"CPU {model}; " + ", ".join(f"{flag} {'yes' if flag in flags else 'no'}" for flag in KERNEL_FLAGS)
