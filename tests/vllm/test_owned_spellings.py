"""Every spelling vLLM's own parser accepts for a setting the operator owns is refused in extraArgs (both pins).

The spellings come from each pinned vLLM's parser, not from our list: the option strings registered for the dest
of every flag the operator renders (vLLM 0.33's EnableDisableAction adds --disable-X to --enable-X, argparse's
BooleanOptionalAction --no-X), every abbreviation argparse resolves to that dest (allow_abbrev: --disable-pre,
-t for -tp), each with '_' for '-' and as --flag=value (FlexibleArgumentParser reads both). An upgrade that adds
a spelling fails here until the guard (epd_connectors.config.vllm.owned_flag) knows it.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from epd_connectors.config.vllm import OWNED_FLAGS, VllmServerConfig
from epd_operator.api.resource import InvalidSpecError, OperatorDefaults, parse_spec
from epd_operator.render import bundles_vllm, render_desired
from tests.vllm import rendered
from tests.vllm.conftest import Vllm

pytestmark = pytest.mark.vllm

OPERATOR_ONLY = (bundles_vllm.MM_PROCESSOR_KWARGS_FLAG,)
"""Flags the operator renders from the spec that the connector library leaves to extra_args."""


def rendered_flags(tmp: Path, checker: str) -> set[str]:
    """Every option the operator renders for the examples and variants the checker of vLLM `checker` judges,
    without their extraArgs (so a newly rendered flag is covered)."""
    model = tmp / "model"
    flags: set[str] = set()
    for name, spec in rendered.specs(checker):
        for case in rendered.cases(name, spec, model=model, workdir=tmp):
            flags.update(arg for arg in case["owned_argv"] if arg.startswith("-"))
    return flags


@pytest.fixture(scope="module")
def parser_spellings(vllm: Vllm, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    flags = rendered_flags(tmp_path_factory.mktemp("argv"), vllm.version)
    answer = vllm.run({"op": "spellings", "flags": sorted({*OWNED_FLAGS, *OPERATOR_ONLY, *flags})})
    answer["rendered"] = flags
    return answer


def variants(spelling: str) -> list[str]:
    """The spelling, with '_' for '-' past the leading dashes, and as --flag=value."""
    dashes = len(spelling) - len(spelling.lstrip("-"))
    underscored = spelling[:dashes] + spelling[dashes:].replace("-", "_")
    return list(dict.fromkeys([spelling, underscored, f"{spelling}=1", f"{underscored}=1"]))


@cache
def _spec() -> dict[str, Any]:
    return rendered.examples()["e-pd-shared-storage"]


def operator_problems(arg: str) -> list[str]:
    spec = {**_spec(), "encoder": {**_spec()["encoder"], "extraArgs": [arg, "1"]}}
    try:
        render_desired(rendered.OWNER, parse_spec(spec), OperatorDefaults())
    except InvalidSpecError as refused:
        return refused.problems
    return []


def test_every_rendered_flag_is_an_owned_setting(parser_spellings: dict[str, Any]) -> None:
    dests = parser_spellings["dests"]
    missing = sorted(set(parser_spellings["rendered"]) - set(dests))
    assert not missing, f"vLLM {parser_spellings['version']} has no such option: {missing}"
    owned = {dests[flag] for flag in [*OWNED_FLAGS, *OPERATOR_ONLY] if flag in dests}
    unowned = sorted(flag for flag in parser_spellings["rendered"] if dests[flag] not in owned)
    assert not unowned, f"rendered but not guarded in extra_args: {unowned}"


def test_the_connector_guard_refuses_every_spelling_of_an_owned_setting(parser_spellings: dict[str, Any]) -> None:
    dests = parser_spellings["dests"]
    library_dests = {dests[flag] for flag in OWNED_FLAGS if flag in dests}
    passed: list[str] = []
    for dest in sorted(library_dests):
        for spelling in parser_spellings["spellings"][dest]:
            for arg in variants(spelling):
                try:
                    VllmServerConfig(role="pd", model="/m", extra_args=(arg, "1"))
                except ValidationError as refused:
                    assert "extra_args" in str(refused) and "Fix: " in str(refused)
                else:
                    passed.append(f"{arg} (vLLM {dest})")
    assert not passed, f"vLLM {parser_spellings['version']} spellings the guard lets through: {passed}"


def test_the_operator_refuses_every_spelling_naming_the_extra_args_field(parser_spellings: dict[str, Any]) -> None:
    passed: list[str] = []
    for dest, spellings in sorted(parser_spellings["spellings"].items()):
        for spelling in spellings:
            for arg in variants(spelling):
                problems = operator_problems(arg)
                prefix = f"spec.encoder.extraArgs = {arg!r}: sets "
                if not any(line.startswith(prefix) and "Fix: remove it; " in line for line in problems):
                    passed.append(f"{arg} (vLLM {dest}): {problems}")
    assert not passed, f"vLLM {parser_spellings['version']} spellings the operator lets through:\n" + "\n".join(passed)


def test_the_spellings_are_vllms_own(parser_spellings: dict[str, Any]) -> None:
    """The derivation sees what each version adds: 0.33 and 0.34 have --disable-X, 0.32 has none."""
    spellings = parser_spellings["spellings"]
    assert "-tp" in spellings["tensor_parallel_size"]
    assert "--no-enable-prefix-caching" in spellings["enable_prefix_caching"]
    paired = {"--disable-prefix-caching", "--disable-mm-embeds", "--disable-lora"}
    found = paired & {
        s for dest in ("enable_prefix_caching", "enable_mm_embeds", "enable_lora") for s in spellings[dest]
    }
    assert found == (set() if parser_spellings["version"] == "0.32.0" else paired)
