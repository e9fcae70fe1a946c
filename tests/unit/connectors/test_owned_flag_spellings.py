"""The extra_args guard reads a flag as vLLM 0.33's parser does: paired --enable-X/--disable-X, negated --no-X,
and abbreviated short forms. (tests/vllm derives every spelling from both pinned vLLMs' own parsers.)"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from epd_connectors.config.vllm import OWNED_FLAGS, VllmServerConfig, owned_flag

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("arg", "flag"),
    [
        ("--disable-prefix-caching", "--enable-prefix-caching"),
        ("--disable-mm-embeds", "--enable-mm-embeds"),
        ("--disable-lora", "--enable-lora"),
        ("--no-disable-prefix-caching", "--enable-prefix-caching"),
        ("--disable_mm_embeds=true", "--enable-mm-embeds"),
        ("--disable-pre", "--enable-prefix-caching"),
        ("-t", "-tp"),
        ("-p", "-pp"),
    ],
)
def test_a_paired_negated_or_abbreviated_spelling_is_refused_naming_the_field(arg: str, flag: str) -> None:
    assert owned_flag(arg) == flag
    with pytest.raises(ValidationError) as refused:
        VllmServerConfig(role="pd", model="/m", extra_args=(arg,))
    message = str(refused.value)
    assert (
        f"extra_args = {arg!r}: would override {flag}, which the operator sets (field {OWNED_FLAGS[flag]})" in message
    )
    assert f"Fix: set {OWNED_FLAGS[flag]} instead of passing {flag}" in message


@pytest.mark.parametrize("arg", ["--disable-log-stats", "--no-trust-remote-code", "--enable-chunked-prefill", "-O3"])
def test_other_paired_flags_pass(arg: str) -> None:
    assert owned_flag(arg) is None
    assert VllmServerConfig(role="pd", model="/m", extra_args=(arg,)).extra_args == (arg,)
