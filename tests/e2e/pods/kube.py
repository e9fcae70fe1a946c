"""kubectl for the real-pod tier: commands, JSON, waits, and port-forwards on loopback.

Every request a test sends to a pod goes through `kubectl port-forward` (kubectl listens on 127.0.0.1, the
apiserver and the kubelet carry the stream into the pod's network namespace), never to a pod or Service
address directly.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

from epd_testenv import portforward

T = TypeVar("T")


class Kubectl:
    """The pinned kubectl against one cluster."""

    def __init__(self, binary: pathlib.Path, kubeconfig: pathlib.Path) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig

    def argv(self, *args: str) -> list[str]:
        return [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args]

    def run(self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120) -> str:
        done = subprocess.run(
            self.argv(*args), input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}):\n{done.stderr}{done.stdout}")
        return done.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json"))

    def apply(self, document: str) -> None:
        self.run("apply", "-f", "-", stdin=document)

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = self.json("get", "pods", "-n", namespace, "-l", selector)["items"]
        return listed

    def port_forward(self, namespace: str, target: str, port: int) -> contextlib.AbstractContextManager[str]:
        """`kubectl port-forward TARGET :PORT` on 127.0.0.1; its base URL while the context lasts."""
        return portforward.port_forward(self.argv(), namespace, target, port)


def eventually(check: Callable[[], T | None], what: str, timeout_s: float, poll_s: float = 1.0) -> T:
    """The first truthy result of `check` (exceptions count as not yet); fails with `what` after the deadline."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while True:
        try:
            result = check()
            if result:
                return result
        except Exception as error:  # any failure means not yet; the last one is shown at the deadline
            last = error
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout_s:.0f} s waiting for {what}" + (f": {last}" if last else "")
            )
        time.sleep(poll_s)


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            found: dict[str, Any] = cond
            return found
    return None
