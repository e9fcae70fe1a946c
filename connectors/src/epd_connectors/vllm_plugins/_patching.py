"""What the version-gated vLLM workarounds share: the running release, their on/off/force switch, and an import
hook that patches one vLLM module right after vLLM itself imports it (so a plugin never imports vLLM modules a
process would not have loaded).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType

Release = tuple[int, int, int]

_OFF = frozenset({"0", "off", "false", "no", "disable", "disabled"})
_AUTO = frozenset({"", "auto", "1", "on", "true", "yes"})
_FORCE = "force"


@dataclass(frozen=True)
class Decision:
    apply: bool
    reason: str


def release_of(version: str) -> Release | None:
    """``(major, minor, patch)`` of a final release (a local label such as ``+cpu`` allowed); None for a
    pre-release, a dev build or anything unparseable (their code is unknown)."""
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:\+[0-9A-Za-z.]+)?", version.strip())
    if match is None:
        return None
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def decide(vllm_version: str, environ: Mapping[str, str], toggle_env: str, known: frozenset[Release]) -> Decision:
    """Whether a workaround applies (pure): never when its switch says off; on a release known to have the
    defect; on any other version only when the switch says ``force``. An unknown switch value means auto."""
    raw = environ.get(toggle_env)
    word = (raw or "").strip().lower()
    if word in _OFF:
        return Decision(False, f"disabled by {toggle_env}={raw}")
    releases = ", ".join(".".join(map(str, r)) for r in sorted(known))
    if release_of(vllm_version) in known:
        return Decision(True, f"vLLM {vllm_version} is a release known to have the defect ({releases})")
    if word == _FORCE:
        return Decision(True, f"forced by {toggle_env}=force on vLLM {vllm_version} (known: {releases})")
    odd = "" if word in _AUTO else f"; {toggle_env}={raw!r} is not one of 0/off, auto/1, force"
    return Decision(False, f"vLLM {vllm_version} is not a release known to have the defect ({releases}){odd}")


Patch = Callable[[ModuleType], object]


class PatchOnImport(MetaPathFinder):
    """Runs `patch` on `module_name` right after it is executed; removes itself once it has fired."""

    def __init__(self, module_name: str, patch: Patch) -> None:
        self.module_name = module_name
        self.patch = patch

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != self.module_name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)  # the other finders, now that this one is gone
        loader = spec.loader if spec is not None else None
        execute = getattr(loader, "exec_module", None)
        if spec is None or loader is None or execute is None:
            return spec
        patch = self.patch

        def exec_module(module: ModuleType) -> None:
            execute(module)
            patch(module)

        # The loader instance belongs to this spec alone; only its exec_module is extended.
        setattr(loader, "exec_module", exec_module)  # noqa: B010 - an instance attribute over the method
        return spec


def arm(module_name: str, patch: Patch) -> None:
    """Patch the module now if it is already imported, else as soon as it is (once per process)."""
    module = sys.modules.get(module_name)
    if module is not None:
        patch(module)
        return
    if not any(isinstance(f, PatchOnImport) and f.module_name == module_name for f in sys.meta_path):
        sys.meta_path.insert(0, PatchOnImport(module_name, patch))


def register(
    name: str,
    decide: Callable[[str, Mapping[str, str]], Decision],
    module_name: str,
    patch: Patch,
    logger: logging.Logger,
) -> None:
    """The body of a workaround's ``vllm.general_plugins`` entry point: decide from the running vLLM and the
    environment, then arm the patch of `module_name`; one log line either way, and never an exception (a plugin
    must never stop vLLM from starting)."""
    try:
        version = str(getattr(importlib.import_module("vllm"), "__version__", "unknown"))
        decision = decide(version, os.environ)
        if not decision.apply:
            logger.info("epd %s: not applied: %s", name, decision.reason)
            return
        logger.debug("epd %s: armed: %s", name, decision.reason)
        arm(module_name, patch)
    except Exception as exc:
        logger.warning("epd %s: not applied: %s: %s", name, type(exc).__name__, exc)
