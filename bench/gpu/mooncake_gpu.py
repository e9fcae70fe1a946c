"""Mooncake on GPU memory, apart from vLLM; prints one JSON line (bench/gpu/gpu_bench.py runs it).

- transfer engine: two engines of this process over TCP (P2PHANDSHAKE), each with a registered CUDA buffer; one
  writes its buffer into the other's; the bytes must arrive intact; the rate of repeated writes.
- store (with --master HOST:PORT, a running mooncake_master whose store client owns the pool): a requester with
  no segment of its own puts a registered CUDA buffer under a key (put_from) and reads it back into another
  CUDA buffer (get_into); the bytes must be equal. It uses vLLM 0.26's call (no tenant id: "default").
"""

from __future__ import annotations

import argparse
import json
import time
from importlib import metadata
from typing import Any

import torch
from mooncake.engine import TransferEngine

MIB = 1024**2


def gpu_buffers(size: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random bytes on the GPU to send, and a zeroed GPU buffer of the same size to receive them."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    source = torch.randint(0, 256, (size,), dtype=torch.uint8, device="cuda", generator=generator)
    return source, torch.zeros(size, dtype=torch.uint8, device="cuda")


def engine_check(size: int, repeats: int) -> dict[str, Any]:
    sender, receiver = TransferEngine(), TransferEngine()
    for engine in (sender, receiver):
        rc = engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
        if rc != 0:
            return {"error": f"initialize -> {rc}"}
    source, target = gpu_buffers(size, seed=0)
    registered = [sender.register_memory(source.data_ptr(), size), receiver.register_memory(target.data_ptr(), size)]
    peer = f"127.0.0.1:{receiver.get_rpc_port()}"
    torch.cuda.synchronize()
    rc = sender.transfer_sync_write(peer, source.data_ptr(), target.data_ptr(), size)
    torch.cuda.synchronize()
    intact = bool(torch.equal(source, target))
    started = time.perf_counter()
    codes = [sender.transfer_sync_write(peer, source.data_ptr(), target.data_ptr(), size) for _ in range(repeats)]
    seconds = time.perf_counter() - started
    return {
        "protocol": "tcp",
        "bytes": size,
        "register_rc": registered,
        "write_rc": rc,
        "intact": intact,
        "source_device": str(source.device),
        "target_device": str(target.device),
        "repeat_rcs": sorted(set(codes)),
        "GB_per_s": round(size * repeats / seconds / 1e9, 3),
    }


def store_check(master: str, size: int) -> dict[str, Any]:
    from mooncake.store import MooncakeDistributedStore  # noqa: PLC0415 - only with a master

    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 64 * MIB, "tcp", "", master)
    if rc != 0:
        return {"error": f"setup -> {rc}"}
    source, target = gpu_buffers(size, seed=1)
    registered = [store.register_buffer(source.data_ptr(), size), store.register_buffer(target.data_ptr(), size)]
    key = f"epd-gpu-check-{time.time_ns()}"
    torch.cuda.synchronize()
    started = time.perf_counter()
    put = store.put_from(key, source.data_ptr(), size)
    put_s = time.perf_counter() - started
    exists = store.is_exist(key)
    started = time.perf_counter()
    got = store.get_into(key, target.data_ptr(), size)
    get_s = time.perf_counter() - started
    torch.cuda.synchronize()
    return {
        "master": master,
        "key": key,
        "bytes": size,
        "register_rc": registered,
        "put_from_rc": put,
        "is_exist": exists,
        "get_into_bytes": got,
        "intact": bool(torch.equal(source, target)),
        "put_GB_per_s": round(size / put_s / 1e9, 3) if put_s else None,
        "get_GB_per_s": round(size / get_s / 1e9, 3) if get_s else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--master", help="HOST:PORT of a running mooncake_master (store check)")
    parser.add_argument("--mib", type=int, default=64)
    args = parser.parse_args()
    out: dict[str, Any] = {"mooncake": metadata.version("mooncake-transfer-engine-cuda13"), "torch": torch.__version__}
    out["transfer_engine"] = engine_check(args.mib * MIB, repeats=8)
    if args.master:
        out["store"] = store_check(args.master, 16 * MIB)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
