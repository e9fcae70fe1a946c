"""OpenMP threads per vLLM instance when instances share a few cores (the local profile's OMP_NUM_THREADS=1).

N processes (steps.py, with the CPU vLLM's own torch from .venv-e2e) each run steps of small matmuls, as a
forward pass of the tiny model is, at once on this machine's cores. Printed for each N: steps per second of all
processes together and of the slowest one, with OMP_NUM_THREADS unset (OpenMP takes every core, vLLM's case
under VLLM_CPU_OMP_THREADS_BIND=nobind) against OMP_NUM_THREADS=1, and the ratio. With more busy processes than
cores, a team of two waits at every barrier for a thread whose core another process holds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def measure(python: Path, processes: int, threads: int | None, seconds: float) -> tuple[float, float]:
    """(steps/s of all processes, of the slowest); threads None leaves OMP_NUM_THREADS unset."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    command = [str(python), str(HERE / "steps.py"), str(seconds)]
    running = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    rates = [float(p.communicate()[0]) for p in running]
    return sum(rates), min(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 4], help="busy processes, one run each")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    python = ROOT / os.environ.get("EPD_E2E_VENV", ".venv-e2e") / "bin" / "python"
    if not python.exists():
        sys.exit(f"bench/omp_threads runs the CPU vLLM's torch: run `make setup-e2e` ({python} is missing)")
    cores = len(os.sched_getaffinity(0))
    print(f"bench/omp_threads: {cores} cores, {args.seconds:.0f} s a run")
    for processes in args.processes:
        unset_all, unset_slowest = measure(python, processes, None, args.seconds)
        one_all, one_slowest = measure(python, processes, 1, args.seconds)
        print(
            f"  {processes} processes: OMP_NUM_THREADS unset {unset_all:.0f} steps/s (slowest {unset_slowest:.0f}),"
            f" =1 {one_all:.0f} (slowest {one_slowest:.0f}): x{one_all / unset_all:.1f} in all"
        )


if __name__ == "__main__":
    main()
