"""The local profile: what a spec written for GPUs needs to run on a CPU-only machine, stated and applied openly.

Every adjustment is a spec field the user could have written (so the bundles still come from render alone),
and `apply_profile` returns one line per field it changed, which the runner prints before it starts anything.
The values are the ones measured with the CPU build of vLLM (shared/docs/facts.md, "Real vLLM on a CPU-only
machine").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from epd_connectors.config.vllm import owned_flag
from epd_operator.api.spec import EPDDeploymentSpec

KV_CACHE_FLAG: Final = "--kv-cache-memory-bytes"
KV_CACHE_ENV: Final = "VLLM_CPU_KVCACHE_SPACE"
"""The CPU build's KV size in whole GiB; when set it overrides KV_CACHE_FLAG, so the profile leaves it out."""

QUIET_VLLM_ENV: Final = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONFAULTHANDLER": "1",
}
"""On any machine: no model hub, no usage reports, and a Python traceback in the log when a process dies of a
signal (a kernel's SIGILL or SIGSEGV; local.failures reads that line)."""

CPU_VLLM_ENV: Final = {
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "TORCHDYNAMO_DISABLE": "1",
    **QUIET_VLLM_ENV,
}
"""Threads not pinned and one OpenMP thread per instance: instances share the cores, and a team of two waits at
every barrier for a thread whose core another instance holds (bench/omp_threads: four busy processes on 2 cores
made about ten times the steps with one thread each). No torch.compile at all: --enforce-eager still leaves the
sampler's logprobs op to inductor, built with g++ at the first request that asks for logprobs, which held a new
decode pod's engine for 2.5 minutes on a busy node (a pod has no warm TorchInductor cache; bench/vllm_start: the
same tokens either way). No VLLM_CPU_KVCACHE_SPACE: the KV size comes from LocalProfile.kv_cache_bytes, which
that variable would override."""


@dataclass(frozen=True)
class LocalProfile:
    """The CPU-only adjustments. A field left None keeps what the spec says."""

    block_size: int | None = 32
    """spec.model.blockSize: the CPU build's default of 128 tokens transfers no KV for short prompts."""
    ec_buffer_device: str | None = "cpu"
    """spec.encoder.bufferDevice: there is no CUDA device for the EC transfer buffer."""
    ec_buffer_bytes: int | None = 64 * 1024**2
    """Upper bound of spec.encoder.bufferSize: every encoder and consumer registers its whole EC buffer at start
    (vLLM's default 1e9 bytes); a tiny model's embeddings are KiB."""
    store_protocol: str | None = "tcp"
    """spec.store.protocol: no RDMA NIC on a laptop; Mooncake's TCP transport."""
    vllm_env: dict[str, str] = field(default_factory=lambda: dict(CPU_VLLM_ENV))
    """Added to the env of every vLLM role (encoder, prefill, decode); a value the spec sets wins."""
    enforce_eager: bool | None = True
    """spec.prefill/decode.enforceEager (encoders always run eager): no torch.compile and no warm-up pass, so an
    instance of the tiny model is healthy in ~35 s instead of ~63 s and takes ~2 GB instead of ~3 GB."""
    kv_cache_bytes: int | None = 64 * 1024**2
    """--kv-cache-memory-bytes added to the extraArgs of every vLLM role, unless the role already gives that flag
    or sets VLLM_CPU_KVCACHE_SPACE in its env (the user's size wins). Without it the CPU build reserves whole GiB;
    64 MiB holds 64 full 2048-token sequences of the tiny test model (512 bytes per token)."""
    store_segment_bytes: int | None = 256 * 1024**2
    """Upper bound of spec.store.clients.segmentSize and spec.store.embeddedSegmentSize: a store client
    allocates its whole segment at start, and a cluster-sized one (tens of GiB) does not fit a laptop."""
    store_buffer_bytes: int | None = 64 * 1024**2
    """Upper bound of the store's local buffers (spec.store.localBufferSize, clients.localBufferSize)."""
    one_instance_per_role: bool = True
    """Every replicas above 1 becomes 1, and HA masters one master: each local instance of a vLLM role takes
    about a minute and a GiB of KV cache on a laptop's few cores, and the local site gives each workload one set
    of ports."""


CPU: Final = LocalProfile()
"""The profile `epd-local run` applies unless told --no-profile."""
NONE: Final = LocalProfile(
    block_size=None,
    ec_buffer_device=None,
    ec_buffer_bytes=None,
    store_protocol=None,
    vllm_env={},
    enforce_eager=None,
    kv_cache_bytes=None,
    store_segment_bytes=None,
    store_buffer_bytes=None,
    one_instance_per_role=False,
)


def apply_profile(spec: EPDDeploymentSpec, profile: LocalProfile) -> tuple[EPDDeploymentSpec, list[str]]:
    """The adjusted spec, and one line per change ("spec.model.blockSize: None -> 32")."""
    changes: list[str] = []

    def changed(path: str, old: Any, new: Any) -> None:
        changes.append(f"{path}: {old!r} -> {new!r}")

    model, encoder, store = spec.model, spec.encoder, spec.store
    if profile.block_size is not None and model.block_size != profile.block_size:
        changed("spec.model.blockSize", model.block_size, profile.block_size)
        model = model.model_copy(update={"block_size": profile.block_size})
    uses_ec_buffer = encoder.pushes_embeddings  # ECExampleConnector has no transfer buffer
    if profile.ec_buffer_device is not None and uses_ec_buffer and encoder.buffer_device != profile.ec_buffer_device:
        changed("spec.encoder.bufferDevice", encoder.buffer_device, profile.ec_buffer_device)
        encoder = encoder.model_copy(update={"buffer_device": profile.ec_buffer_device})
    if uses_ec_buffer:
        encoder = _capped(encoder, "spec.encoder", {"buffer_size": "bufferSize"}, profile.ec_buffer_bytes, changes)
    if store is not None and profile.store_protocol is not None and store.protocol != profile.store_protocol:
        changed("spec.store.protocol", store.protocol, profile.store_protocol)
        store = store.model_copy(update={"protocol": profile.store_protocol})
    if store is not None:
        store = _store_memory(store, profile, changes)
    encoder = _with_env(encoder, "spec.encoder", profile.vllm_env, changes)
    decode = _with_env(spec.decode, "spec.decode", profile.vllm_env, changes)
    prefill = _with_env(spec.prefill, "spec.prefill", profile.vllm_env, changes) if spec.prefill else None
    encoder = _with_kv_cache(encoder, "spec.encoder", profile.kv_cache_bytes, changes)
    decode = _with_kv_cache(
        _eager(decode, "spec.decode", profile, changes), "spec.decode", profile.kv_cache_bytes, changes
    )
    if prefill is not None:
        prefill = _eager(prefill, "spec.prefill", profile, changes)
        prefill = _with_kv_cache(prefill, "spec.prefill", profile.kv_cache_bytes, changes)
    proxy = spec.proxy
    if profile.one_instance_per_role:
        encoder = _one(encoder, "spec.encoder", changes)
        decode = _one(decode, "spec.decode", changes)
        proxy = _one(proxy, "spec.proxy", changes)
        if prefill is not None:
            prefill = _one(prefill, "spec.prefill", changes)
            pools = [
                _one(pool, f"spec.prefill.additionalPools[{i}]", changes)
                for i, pool in enumerate(prefill.additional_pools)
            ]
            prefill = prefill.model_copy(update={"additional_pools": pools})
        if store is not None and not store.clients.per_node:
            store = store.model_copy(update={"clients": _one(store.clients, "spec.store.clients", changes)})
        if store is not None and store.master.ha is not None:
            changes.append(f"spec.store.master.ha: {store.master.ha.replicas} masters -> unset (one master)")
            store = store.model_copy(update={"master": store.master.model_copy(update={"ha": None})})
    adjusted = spec.model_copy(
        update={
            "model": model,
            "encoder": encoder,
            "store": store,
            "decode": decode,
            "prefill": prefill,
            "proxy": proxy,
        }
    )
    # Round-trip through validation, so an adjusted spec obeys every rule a written one does.
    return EPDDeploymentSpec.model_validate(adjusted.model_dump(by_alias=True)), changes


def _with_env(section: Any, path: str, env: dict[str, str], changes: list[str]) -> Any:
    added = {k: v for k, v in env.items() if k not in section.env}
    if not added:
        return section
    changes.append(f"{path}.env: + {', '.join(f'{k}={v}' for k, v in added.items())}")
    return section.model_copy(update={"env": {**added, **section.env}})


def _eager(section: Any, path: str, profile: LocalProfile, changes: list[str]) -> Any:
    if profile.enforce_eager is None or section.enforce_eager == profile.enforce_eager:
        return section
    changes.append(f"{path}.enforceEager: {section.enforce_eager!r} -> {profile.enforce_eager!r}")
    return section.model_copy(update={"enforce_eager": profile.enforce_eager})


def _with_kv_cache(section: Any, path: str, size: int | None, changes: list[str]) -> Any:
    # The flag in any spelling vLLM's argparse accepts (--kv_cache_memory_bytes=N, a prefix) counts as given.
    given = any(owned_flag(arg, (KV_CACHE_FLAG,)) for arg in section.extra_args)
    if size is None or given or KV_CACHE_ENV in section.env:
        return section
    changes.append(f"{path}.extraArgs: + {KV_CACHE_FLAG} {size}")
    return section.model_copy(update={"extra_args": [*section.extra_args, KV_CACHE_FLAG, str(size)]})


def _one(section: Any, path: str, changes: list[str]) -> Any:
    if section.replicas <= 1:
        return section
    changes.append(f"{path}.replicas: {section.replicas} -> 1")
    return section.model_copy(update={"replicas": 1})


def _capped(section: Any, path: str, names: dict[str, str], cap: int | None, changes: list[str]) -> Any:
    update: dict[str, int] = {}
    for name, alias in names.items():
        value = getattr(section, name)
        if cap is not None and value > cap:
            changes.append(f"{path}.{alias}: {value} -> {cap} bytes")
            update[name] = cap
    return section.model_copy(update=update) if update else section


def _store_memory(store: Any, profile: LocalProfile, changes: list[str]) -> Any:
    segment, buffer = profile.store_segment_bytes, profile.store_buffer_bytes
    if store.mode == "standalone":
        clients = _capped(store.clients, "spec.store.clients", {"segment_size": "segmentSize"}, segment, changes)
        clients = _capped(clients, "spec.store.clients", {"local_buffer_size": "localBufferSize"}, buffer, changes)
        store = store.model_copy(update={"clients": clients})
    else:
        store = _capped(store, "spec.store", {"embedded_segment_size": "embeddedSegmentSize"}, segment, changes)
    return _capped(store, "spec.store", {"local_buffer_size": "localBufferSize"}, buffer, changes)
