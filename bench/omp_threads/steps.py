"""One busy process for bench/omp_threads/run.py: prints the steps per second it made (run with the CPU vLLM's
Python, whose torch is the one vLLM runs; OpenMP's thread count comes from the environment, as in a vLLM role)."""

from __future__ import annotations

import sys
import time

import torch

OPS_PER_STEP = 50
"""Small matmuls a step, each an OpenMP parallel region, as a forward pass of the tiny 2-layer model is."""


def main() -> None:
    seconds = float(sys.argv[1])
    x0, w = torch.randn(64, 128), torch.randn(128, 128)
    end, steps = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        x = x0
        for _ in range(OPS_PER_STEP):
            x = torch.tanh(x @ w)
        steps += 1
    print(steps / seconds)


if __name__ == "__main__":
    main()
