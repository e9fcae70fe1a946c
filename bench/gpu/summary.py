"""Markdown summary of a bench/gpu results.json (gpu_bench.py's), on stdout: `python summary.py results.json`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _fmt(value: Any, digits: int = 1) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return "-" if value is None else str(value)


def correctness(data: dict[str, Any]) -> list[str]:
    lines = ["## Correctness (tiny Qwen2-VL, greedy, 16 tokens)", ""]
    start = data.get("correctness_start", {})
    for name, entry in start.items():
        lines.append(f"- start {name}: {json.dumps(entry.get('ready_after_s'))} error: {entry.get('error') or '-'}")
    result = data.get("correctness")
    if not result:
        lines.append(f"- no answers: {data.get('correctness_failure', 'the phase did not reach its requests')}")
        return lines
    ref = result.get("reference", {}).get("answers", {})
    lines += ["", "| request | single instance | " + " | ".join(k for k in result if k not in _NOT_STACKS) + " |"]
    lines.append("|---" * (2 + len([k for k in result if k not in _NOT_STACKS])) + "|")
    for kind, answer in ref.items():
        row = [kind, repr(answer.get("text", answer.get("error")))[:60]]
        for name, stack in result.items():
            if name in _NOT_STACKS:
                continue
            equal = stack.get("equal", {}).get(kind)
            row.append("equal (plain and streamed)" if equal else f"DIFFERS: {stack.get('error', '')[:80]}")
        lines.append("| " + " | ".join(row) + " |")
    for name, stack in result.items():
        if name not in _NOT_STACKS:
            busy = stack.get("equal_in_flight_8", {})
            lines.append(f"- {name}: 8 image requests in flight, {sum(bool(v) for v in busy.values())} of 8 equal")
    lines.append(f"- single instance, streamed equal to plain: {result.get('reference_stream_equal')}")
    evidence = data.get("evidence", {})
    for name, entry in evidence.items():
        if isinstance(entry, dict) and "ec_files" in entry:
            lines.append(f"- {name}: EC files {entry['ec_files']}")
        if isinstance(entry, dict) and "mooncake_gpu" in entry:
            lines.append(f"- {name}: mooncake_gpu {json.dumps(entry['mooncake_gpu'])[:900]}")
    return lines


_NOT_STACKS = {"reference", "reference_stream_equal"}


def timing(data: dict[str, Any]) -> list[str]:
    lines = ["", "## Timing (Qwen2-VL-7B shape, random weights, one GPU)", ""]
    start = data.get("timing_start", {})
    for name in ("single", "E+PD"):
        entry = start.get(name, {})
        lines.append(f"- start {name}: {json.dumps(entry.get('ready_after_s'))} error: {entry.get('error') or '-'}")
    table = data.get("timing")
    if not table:
        lines.append(f"- no figures: {data.get('timing_failure', 'the phase did not reach its benches')}")
        return lines
    lines += [
        "",
        "| workload | server | TTFT mean / median / p99 (ms) | TPOT mean (ms) | req/s | output tok/s | done |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in table.values():
        for target in ("single", "E+PD"):
            f = row.get(target, {})
            if "error" in f:
                lines.append(f"| {row['workload']} | {target} | {f['error'][:80]} | | | | |")
                continue
            ttft = " / ".join(_fmt(f.get(k)) for k in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms"))
            lines.append(
                f"| {row['workload']} | {target} | {ttft} | {_fmt(f.get('mean_tpot_ms'), 2)} | "
                f"{_fmt(f.get('request_throughput'), 2)} | {_fmt(f.get('output_throughput'))} | "
                f"{f.get('completed')}/{(f.get('completed') or 0) + (f.get('failed') or 0)} |"
            )
    return lines


def main() -> int:
    data = json.loads(Path(sys.argv[1]).read_text())
    lines = [f"# bench/gpu run, started {data.get('started')}", ""]
    lines += correctness(data)
    lines += timing(data)
    for key in ("correctness_seconds", "timing_seconds", "correctness_failure", "timing_failure"):
        if key in data:
            lines.append(f"- {key}: {data[key]}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
