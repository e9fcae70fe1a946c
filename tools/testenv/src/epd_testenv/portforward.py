"""`kubectl port-forward` on loopback, as a context manager: how tests and the demo reach real pods.

kubectl listens on 127.0.0.1 and the apiserver and the kubelet carry the stream into the pod's network namespace,
so nothing ever connects to a pod or Service address directly.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence

FORWARDING = re.compile(r"Forwarding from 127\.0\.0\.1:(\d+) ->")
START_TIMEOUT_S = 30.0


@contextlib.contextmanager
def port_forward(kubectl: Sequence[str], namespace: str, target: str, port: int) -> Iterator[str]:
    """`kubectl port-forward TARGET :PORT` (kubectl: its argv up to the subcommand, kubeconfig included); yields
    the base URL http://127.0.0.1:N. kubectl's output goes to a file: it writes a line per connection, which
    would fill a pipe nobody reads."""
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(
            [*kubectl, "port-forward", "-n", namespace, "--address", "127.0.0.1", target, f":{port}"],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                log.seek(0)
                output = log.read()
                found = FORWARDING.search(output)
                if found is not None:
                    break
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"kubectl port-forward {target} :{port} did not start: {output}")
                time.sleep(0.05)
            yield f"http://127.0.0.1:{found.group(1)}"
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
