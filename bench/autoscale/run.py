"""Encoders that scale themselves, measured on the real node: a load step through the proxy, then its end.

Runs the real-pod autoscaling tests (tests/e2e/pods/test_e_pd.py: KEDA built from its Go module, the cluster's
HPA controller, Prometheus scraping the proxy, real vLLM pods of the tiny model) and prints what they measured:
how long after the load step the new encoder takes traffic, against that encoder's own start (created to Ready;
goal: within 1.5x, the rest being the signal, KEDA and the HPA); requests failed; the encoder replica-seconds
used from the step until one encoder is left, against a fixed fleet sized for the peak over the same time; the
way down (load off until 1 encoder; text only until 0; an image at 0 until answered). Needs root and the set-up of
`make test-pods`; about 10 minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from epd_testenv.timeline import machine

ROOT = Path(__file__).resolve().parents[2]
TESTS = "grow_to_two_under_load or go_to_zero"
GOAL_RATIO = 1.5


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="epd-bench-autoscale-") as tmp:
        out = Path(tmp) / "figures.json"
        env = {
            **os.environ,
            "EPD_AUTOSCALE_FIGURES": str(out),
            "EPD_E2E_VENV": os.environ.get("EPD_E2E_VENV", ".venv-e2e"),
        }
        argv = [sys.executable, "-m", "pytest", "-m", "pods", "-p", "no:cacheprovider", "-q", "-k", TESTS]
        done = subprocess.run([*argv, "tests/e2e/pods/test_e_pd.py"], cwd=ROOT, env=env, check=False)
        if done.returncode != 0 or not out.exists():
            print(f"bench/autoscale: the tests failed (rc {done.returncode}); no figures", file=sys.stderr)
            return 1
        f = json.loads(out.read_text())
    ratio = f["routed_s"] / f["own_start_s"]
    rows = [
        ("load step until the new encoder takes traffic", f"{f['routed_s']:.1f} s"),
        ("that encoder's own start (created to Ready)", f"{f['own_start_s']:.1f} s"),
        ("ratio (goal <= 1.5x)", f"{ratio:.2f}x {'met' if ratio <= GOAL_RATIO else 'NOT met'}"),
        ("requests failed", f"{f['failed']:.0f} of {f['requests']:.0f}"),
        ("encoder replica-seconds used, step to 1 left", f"{f['replica_seconds']:.0f}"),
        ("the same for a fixed fleet of the peak (2)", f"{f['fixed_fleet_replica_seconds']:.0f}"),
        ("share used", f"{f['replica_seconds'] / f['fixed_fleet_replica_seconds']:.0%}"),
        ("load off until 1 encoder is left", f"{f['scale_down_s']:.1f} s"),
        ("text only until no encoder is left", f"{f['to_zero_s']:.1f} s"),
        ("an image at 0 encoders until answered", f"{f['woken_s']:.1f} s"),
    ]
    print(f"bench/autoscale on {machine()}")
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
