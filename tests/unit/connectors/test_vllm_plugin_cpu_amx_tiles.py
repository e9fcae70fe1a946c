"""cpu_amx_tiles without vLLM: on the CPU platform it asks Linux for AMX tile permission, once per process, when
vLLM's attention chooses "amx", and logs each ISA vLLM chooses; another platform or a module it was not written
for is left alone. The permission request itself is the real syscall, judged against this machine's
/proc/cpuinfo. The real kernels, with and without the request, are tests/e2e/test_cpu_attention_isa.py."""

from __future__ import annotations

import logging
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from epd_connectors.vllm_plugins import cpu_amx_tiles

pytestmark = pytest.mark.unit


def attention_module(*, cpu: bool = True, amx: bool = True) -> ModuleType:
    """The parts of vllm.v1.attention.backends.cpu_attn the plugin reads, with vLLM's ISA rule reduced."""
    module = ModuleType("fake_cpu_attn")
    module.current_platform = SimpleNamespace(is_cpu=lambda: cpu)  # type: ignore[attr-defined]

    def _get_attn_isa(dtype: str, block_size: int, head_size: int | None = None) -> str:
        return "amx" if amx and dtype == "bf16" and block_size % 32 == 0 else "vec"

    module._get_attn_isa = _get_attn_isa  # type: ignore[attr-defined]
    return module


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts permission requests instead of making them."""
    made: list[int] = []

    def request() -> cpu_amx_tiles.Permission:
        made.append(1)
        return cpu_amx_tiles.Permission(True, "xfeatures 0x60003")

    monkeypatch.setattr(cpu_amx_tiles, "request_permission", request)
    return made


def test_choosing_amx_asks_for_permission_once_and_each_isa_is_logged_once(
    requests: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    module = attention_module()
    with caplog.at_level(logging.INFO, logger=cpu_amx_tiles.logger.name):
        assert cpu_amx_tiles.patch_attention_module(module)
        assert module._get_attn_isa("bf16", 32, head_size=64) == "amx"
        assert module._get_attn_isa("bf16", 32, head_size=64) == "amx"
        assert module._get_attn_isa("f32", 32, head_size=64) == "vec"
    assert requests == [1]
    assert "AMX tile permission for pid" in caplog.text and "granted (xfeatures 0x60003)" in caplog.text
    assert cpu_amx_tiles.isa_choices(caplog.text) == [
        "amx for dtype bf16, block_size 32, head_size 64",
        "vec for dtype f32, block_size 32, head_size 64",
    ]


def test_without_amx_it_asks_nothing_and_still_logs_the_isa(
    requests: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    module = attention_module(amx=False)
    with caplog.at_level(logging.INFO, logger=cpu_amx_tiles.logger.name):
        assert cpu_amx_tiles.patch_attention_module(module)
        module._get_attn_isa("bf16", 32)
    assert requests == []
    assert cpu_amx_tiles.isa_choices(caplog.text) == ["vec for dtype bf16, block_size 32"]


def test_patching_twice_wraps_once(requests: list[int]) -> None:
    module = attention_module()
    assert cpu_amx_tiles.patch_attention_module(module)
    wrapped = module._get_attn_isa
    assert cpu_amx_tiles.patch_attention_module(module)
    assert module._get_attn_isa is wrapped
    module._get_attn_isa("bf16", 32)
    assert requests == [1]


def test_another_platform_or_an_unknown_module_is_left_alone(requests: list[int]) -> None:
    gpu = attention_module(cpu=False)
    original = gpu._get_attn_isa
    assert not cpu_amx_tiles.patch_attention_module(gpu)
    assert gpu._get_attn_isa is original
    unknown = attention_module()
    del unknown._get_attn_isa
    assert not cpu_amx_tiles.patch_attention_module(unknown)
    broken = attention_module()
    broken.current_platform = SimpleNamespace(is_cpu=lambda: 1 / 0)  # type: ignore[attr-defined]
    assert not cpu_amx_tiles.patch_attention_module(broken)
    original("bf16", 32)
    assert requests == []


def test_the_permission_request_is_granted_exactly_on_a_cpu_with_amx_tiles() -> None:
    """The real arch_prctl in this process: granted where the CPU has AMX tiles, EOPNOTSUPP elsewhere."""
    flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    permission = cpu_amx_tiles.request_permission()
    if "amx_tile" in flags.split():
        assert permission.granted, permission
        assert cpu_amx_tiles.request_permission().granted, "asking again is harmless"
    else:
        assert not permission.granted
        assert "ARCH_REQ_XCOMP_PERM" in permission.detail and "errno 95" in permission.detail, permission
