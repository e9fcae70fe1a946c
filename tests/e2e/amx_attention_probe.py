"""One decode step of vLLM's CPU paged attention, run on its own in a fresh process: the crash of issue 11 at its
smallest, and the check that the cpu_amx_tiles plugin's permission request cures it.

    python amx_attention_probe.py ISA [--request-permission]     (ISA "chosen": what vLLM picks on this CPU)

Writes a KV cache of KV_LEN tokens with vLLM's own reshape-and-cache kernel for ISA ("amx", "vec", "vec16"),
then attends one query token to it with cpu_attention_with_kv_cache, as a decode whose prompt KV arrived by
transfer does in its first step, and prints the largest difference from an attention computed in float32 by
torch. Nothing else runs before the kernel, so no oneDNN GEMM has asked Linux for AMX tile permission on the
process's behalf. On an AMX CPU, ISA "amx" without --request-permission dies of SIGILL at the first tile
instruction; with it, it prints a difference within bf16 rounding. The shapes are the tiny test model's
(2 query heads, 1 KV head, head size 64, bf16, 32-token blocks).

Run with the e2e venv's Python (vLLM's CPU build); tests/e2e/test_cpu_attention_isa.py does.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from vllm import _custom_ops as ops

from epd_connectors.vllm_plugins import cpu_amx_tiles

HEADS, KV_HEADS, HEAD_SIZE, BLOCK, KV_LEN = 2, 1, 64, 32, 40


def reference(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Attention of the last position over every key, in float32 (GQA: each KV head serves HEADS // KV_HEADS)."""
    group = HEADS // KV_HEADS
    k = keys.float().repeat_interleave(group, dim=1)  # [KV_LEN, HEADS, HEAD_SIZE]
    v = values.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,thd->ht", query.float()[0], k) / HEAD_SIZE**0.5
    return torch.einsum("ht,thd->hd", scores.softmax(dim=-1), v).unsqueeze(0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("isa")
    parser.add_argument("--request-permission", action="store_true")
    args = parser.parse_args()
    if args.isa == "chosen":  # vLLM's own choice for these shapes, as its attention builder makes it
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa  # noqa: PLC0415 - only for this mode

        args.isa = _get_attn_isa(torch.bfloat16, BLOCK, HEAD_SIZE)
    if args.request_permission:
        print(json.dumps({"permission": cpu_amx_tiles.request_permission().describe()}), flush=True)
    generator = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16
    keys = torch.randn(KV_LEN, KV_HEADS, HEAD_SIZE, generator=generator).to(dtype)
    values = torch.randn(KV_LEN, KV_HEADS, HEAD_SIZE, generator=generator).to(dtype)
    query = torch.randn(1, HEADS, HEAD_SIZE, generator=generator).to(dtype)
    num_blocks = (KV_LEN + BLOCK - 1) // BLOCK
    kv_cache = torch.zeros(num_blocks, KV_HEADS, BLOCK, 2 * HEAD_SIZE, dtype=dtype)
    key_cache, value_cache = kv_cache.view(num_blocks, KV_HEADS, 2 * BLOCK, HEAD_SIZE).chunk(2, dim=2)
    slots = torch.arange(KV_LEN, dtype=torch.int64)
    ops.cpu_attn_reshape_and_cache(keys, values, key_cache, value_cache, slots, args.isa)
    query_start_loc = torch.tensor([0, 1], dtype=torch.int32)
    seq_lens = torch.tensor([KV_LEN], dtype=torch.int32)
    metadata = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=1,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_dim=HEAD_SIZE,
        seq_lens=seq_lens,
        dtype=dtype,
        query_start_loc=query_start_loc,
        causal=True,
        sliding_window_size=-1,
        isa=args.isa,
        enable_kv_split=False,
    )
    output = torch.empty_like(query)
    print(json.dumps({"isa": args.isa, "attention": "starting"}), flush=True)
    ops.cpu_attention_with_kv_cache(
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        output=output,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        scale=HEAD_SIZE**-0.5,
        causal=True,
        alibi_slopes=None,
        sliding_window=-1,
        block_table=torch.arange(num_blocks, dtype=torch.int32).unsqueeze(0),
        softcap=0.0,
        scheduler_metadata=metadata,
        s_aux=None,
    )
    error = (output.float() - reference(query, keys, values)).abs().max().item()
    print(json.dumps({"isa": args.isa, "max_abs_error": error}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
