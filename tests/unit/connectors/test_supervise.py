"""epd-launch's supervision (an HA master as a container's PID 1): signals reach the child and the exit code is
the child's. Each case runs the supervisor in a subprocess, as it installs process-wide signal handlers; the
PID 1 case itself, with real masters, is tests/store/test_epd_launch.py."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

SUPERVISE = "import sys; from epd_connectors.launch import supervise; sys.exit(supervise.run({0!r}, {1!r}, {{}}))"


def supervised(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", SUPERVISE.format(argv[0], argv)], stdout=subprocess.PIPE)


def test_the_exit_code_is_the_childs() -> None:
    with supervised(["/bin/sh", "-c", "exit 7"]) as process:
        assert process.wait(timeout=10) == 7


@pytest.mark.parametrize("forwarded", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_reaches_the_child_whose_default_action_ends_it(forwarded: signal.Signals) -> None:
    with supervised(["/bin/sh", "-c", "echo started; exec sleep 60"]) as process:
        assert process.stdout is not None and process.stdout.readline() == b"started\n"  # handlers are in place
        process.send_signal(forwarded)
        assert process.wait(timeout=10) == 128 + forwarded
