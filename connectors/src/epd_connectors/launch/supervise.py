"""epd-launch as a container's PID 1 over a program that ignores SIGTERM there.

The kernel delivers to a PID namespace's init only the signals it has a handler for, so a program that installs
no SIGTERM handler (Mooncake's master in HA mode) never sees the SIGTERM that deleting its pod sends: it keeps
leading until the kubelet's SIGKILL at the end of the grace period (30 s by default), and only then may a
standby take over. Run as a child instead, the program gets SIGTERM's default action; epd-launch forwards every
signal a container runtime sends, reaps what PID 1 adopts, and exits as the program did.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from types import FrameType

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def run(executable: str, argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Start `argv` as a child, forward FORWARDED to it, and return its exit code (128 + N after signal N)."""
    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child is None:
            pending.append(signum)  # arrived before the child existed: sent once it does
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signum)

    for forwarded in FORWARDED:
        signal.signal(forwarded, forward)
    child = subprocess.Popen(list(argv), executable=executable, env=dict(env))
    for early in pending:
        os.kill(child.pid, early)
    while True:
        pid, status = os.wait()  # any child: PID 1 also reaps the orphans it adopts
        if pid == child.pid:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code
