"""Flags over environment over defaults: the one way a command of this project merges its settings.

A pod, a bundle or a Helm chart sets the environment, a person types flags: a flag wins over its variable,
a variable over the default. Flags are parsed with default None, so "not given" is visible; an empty variable
counts as unset, so a chart can leave one blank.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

T = TypeVar("T")

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
"""What a variable says to turn a switch on; anything else turns it off."""


@dataclass(frozen=True)
class Layered:
    """One command's parsed flags and its environment; each setting is read through one of the methods."""

    args: argparse.Namespace
    environ: Mapping[str, str]
    prefix: str
    """The variables' common prefix (EPD_PROXY_): a flag's variable is the prefix and its dest in upper case."""

    def variable(self, dest: str) -> str | None:
        """The variable behind `dest` (a flag's dest, or the variable's own suffix); None when unset or empty."""
        return self.environ.get(self.prefix + dest.upper()) or None

    def value(self, dest: str, default: T, parse: Callable[[str], T], *, env: str | None = None) -> T:
        """The flag when given, else the variable parsed, else `default`."""
        flag = getattr(self.args, dest, None)
        if flag is not None:
            return cast("T", flag)
        raw = self.variable(env or dest)
        return parse(raw) if raw is not None else default

    def switch(self, dest: str, default: bool = False, *, env: str | None = None) -> bool:
        """A store_true flag when given, else whether the variable is one of TRUE_WORDS, else `default`."""
        flag = getattr(self.args, dest, None)
        if flag is not None:
            return bool(flag)
        raw = self.variable(env or dest)
        return raw.strip().lower() in TRUE_WORDS if raw is not None else default

    def items(
        self, dest: str, parse: Callable[[str], T], default: Sequence[T] = (), *, env: str | None = None
    ) -> list[T]:
        """A repeated flag's values when given (they replace the variable's), else the variable's
        comma-separated values, else `default`."""
        flag = getattr(self.args, dest, None)
        if flag:
            return list(flag)
        raw = self.variable(env or dest)
        if raw is None:
            return list(default)
        return [parse(v.strip()) for v in raw.split(",") if v.strip()]
