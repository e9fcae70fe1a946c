"""What in a role's log means it has failed while its process still runs.

vLLM's API server outlives an engine core that died: while starting it may wait for a core that logged its death
but hangs on its way out (a connector's shutdown raising, its threads still running), and once serving it answers
/health with 503 and every request with 500. Its log says so at once, in one of these lines, so a runner that reads
them stops the role instead of waiting out a deadline or serving errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

FATAL_MARKERS: Final = (
    "EngineCore failed to start.",
    "EngineCore encountered a fatal error.",
    "Engine core initialization failed.",
    "Fatal Python error:",
)
"""vLLM 0.32/0.33's engine core failing while it starts and while it serves (v1/engine/core.py), the API server
seeing a core exit while it starts (v1/engine/utils.py), and Python's fault handler on a fatal signal (SIGILL,
SIGSEGV, SIGABRT; PYTHONFAULTHANDLER=1, which the local profile sets)."""


def fatal_line(text: str) -> str | None:
    """The first line of `text` that says a vLLM process died (stripped), or None."""
    for line in text.splitlines():
        if any(marker in line for marker in FATAL_MARKERS):
            return line.strip()
    return None


def failure(returncode: int | None, fatal: str | None) -> str | None:
    """Why a role has failed, from its process's exit code (None while it runs) and its log's fatal line."""
    said = f"its log says {fatal!r}" if fatal is not None else ""
    if returncode is not None:
        return f"exited with code {returncode}" + (f"; {said}" if said else "")
    return said or None


@dataclass
class LogWatch:
    """Reads a growing log from where it stopped and remembers the first fatal line it saw."""

    path: Path
    offset: int = 0
    partial: str = ""
    found: str | None = field(default=None)
    offset_at_start: int = field(init=False)
    """Where this life of the log begins (a restarted instance appends to its log)."""

    def __post_init__(self) -> None:
        self.offset_at_start = self.offset

    def fatal(self) -> str | None:
        """The first fatal line written so far, reading only what was appended since the last call."""
        if self.found is not None or not self.path.exists():
            return self.found
        with self.path.open("rb") as log:
            log.seek(self.offset)
            chunk = log.read()
        self.offset += len(chunk)
        text = self.partial + chunk.decode(errors="replace")
        complete, _, self.partial = text.rpartition("\n")
        self.found = fatal_line(complete)
        return self.found
