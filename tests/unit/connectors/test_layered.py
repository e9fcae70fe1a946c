"""Flags over environment over defaults (epd_connectors.config.layered), as the operator and the proxy use it."""

from __future__ import annotations

import argparse

import pytest

from epd_connectors.config.layered import Layered

pytestmark = pytest.mark.unit


def layered(argv: list[str], **environ: str) -> Layered:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int)
    p.add_argument("--on", action="store_true", default=None)
    p.add_argument("--url", action="append")
    return Layered(p.parse_args(argv), {f"X_{k}": v for k, v in environ.items()}, "X_")


def test_a_flag_wins_over_its_variable_and_the_variable_over_the_default() -> None:
    assert layered(["--port", "1"], PORT="2").value("port", 3, int) == 1
    assert layered([], PORT="2").value("port", 3, int) == 2
    assert layered([], PORT="").value("port", 3, int) == 3, "an empty variable is unset"
    assert layered([]).switch("on", True) and layered(["--on"], ON="no").switch("on")
    assert not layered([], ON="off").switch("on", True)
    assert layered([], URL="a, b,").items("url", str) == ["a", "b"]
    assert layered(["--url", "c"], URL="a,b").items("url", str) == ["c"], "a repeated flag replaces the list"
    assert layered([]).items("url", str, ["d"]) == ["d"]
    assert layered([], NAMES="x").items("url", str, env="NAMES") == ["x"]
