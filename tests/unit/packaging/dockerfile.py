"""A small Dockerfile reader for the packaging tests: instructions, stages, ARG defaults, labels, exec forms.

It reads what the tests check and nothing more (no heredocs, no ONBUILD): lines joined at a trailing
backslash, comments and blank lines dropped, `${VAR}` / `$VAR` expanded from ARG defaults in scope (the global
ones before the first FROM, then the stage's own).
"""

from __future__ import annotations

import json
import pathlib
import re
import shlex
from dataclasses import dataclass, field

_VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@dataclass(frozen=True)
class Instruction:
    keyword: str
    """Upper case: FROM, ARG, RUN, ..."""
    args: str


@dataclass
class Stage:
    """One FROM ... [AS name] and what follows it."""

    base: str
    """The image it starts from, ARGs expanded (a stage name or an image reference)."""
    name: str | None
    args: dict[str, str] = field(default_factory=dict)
    instructions: list[Instruction] = field(default_factory=list)

    def expand(self, text: str, global_args: dict[str, str]) -> str:
        scope = {**global_args, **self.args}
        return _VAR.sub(lambda m: scope.get(m.group(1) or m.group(2), m.group(0)), text)

    def all(self, keyword: str) -> list[str]:
        return [i.args for i in self.instructions if i.keyword == keyword]


@dataclass
class Dockerfile:
    path: pathlib.Path
    global_args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def labels(self) -> dict[str, str]:
        """The final stage's LABELs, ARGs expanded."""
        found: dict[str, str] = {}
        for args in self.final.all("LABEL"):
            for pair in shlex.split(args):
                key, _, value = pair.partition("=")
                found[key] = self.final.expand(value, self.global_args)
        return found

    def exec_form(self, keyword: str) -> list[str] | None:
        """The last CMD or ENTRYPOINT of the final stage in exec (JSON) form; None if absent."""
        values = self.final.all(keyword)
        if not values:
            return None
        parsed = json.loads(values[-1])
        assert isinstance(parsed, list), f"{self.path}: {keyword} is not in exec form"
        return [str(x) for x in parsed]

    def user(self) -> str | None:
        users = self.final.all("USER")
        return users[-1].strip() if users else None


def _logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or not stripped:
            continue  # comments (and parser directives) and blank lines, also inside a continuation
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    if current:
        lines.append(current)
    return lines


def _arg(args: str) -> tuple[str, str]:
    name, _, default = args.partition("=")
    return name.strip(), default.strip().strip('"')


def parse(path: pathlib.Path) -> Dockerfile:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in _logical_lines(path.read_text()):
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            words = args.split()
            image = _VAR.sub(lambda m: global_args.get(m.group(1) or m.group(2), m.group(0)), words[0])
            name = words[2] if len(words) == 4 and words[1].upper() == "AS" else None
            stages.append(Stage(image, name))
        elif keyword == "ARG" and not stages:
            key, default = _arg(args)
            global_args[key] = default
        elif stages:
            if keyword == "ARG":
                key, default = _arg(args)
                stages[-1].args[key] = default or global_args.get(key, "")
            stages[-1].instructions.append(Instruction(keyword, args))
    return Dockerfile(path, global_args, stages)
