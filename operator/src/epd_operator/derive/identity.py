"""Identities derived from the deployment and the model: tenant id, cache prefixes, PYTHONHASHSEED.

Each must be stable (the same spec gives the same value on every reconcile and every operator restart), so
each is a hash of its inputs, never random and never a timestamp. The cache prefixes hash the model identity
so that new weights can never read embeddings or KV blocks written by old ones.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from epd_connectors.config.mooncake import TENANT_RE
from epd_operator.api.model import ModelSpec

TENANT_MAX_LEN = 63
"""Mooncake's tenant rule as the connector library narrows it (TENANT_RE): 1-63 characters."""
_SUFFIX_LEN = 8
"""Hex digits of the hash suffix of a shortened tenant id: 32 bits, ample for names in one cluster."""
PREFIX_HASH_LEN = 16
"""Hex digits of a derived cache prefix: 64 bits, so two model identities never share a prefix."""
EMBEDDING_PREFIX_HEAD = "emb-"
KV_PREFIX_HEAD = "kv-"
REVISION_HEAD = "model-revision"


def _digest(*parts: str) -> str:
    # A separator that cannot occur in Kubernetes names keeps ("a-b", "c") and ("a", "b-c") apart.
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def tenant_id(override: str | None, namespace: str, name: str) -> str:
    """spec.store.tenant.id, else "<namespace>.<name>", shortened with a hash suffix when too long.

    Namespace plus name is unique in a cluster and never changes for the resource's life, so the tenant is
    stable; it is readable, so an operator of the store can tell whose keys they are. The dot keeps the pair
    unambiguous: a namespace is a DNS label and never holds one, whereas with a dash ("team-a", "vl") and
    ("team", "a-vl") would share a tenant.
    """
    if override:
        return override
    readable = f"{namespace}.{name}"
    if len(readable) <= TENANT_MAX_LEN and TENANT_RE.match(readable):
        return readable
    suffix = _digest("tenant", namespace, name)[:_SUFFIX_LEN]
    head = readable[: TENANT_MAX_LEN - _SUFFIX_LEN - 1].rstrip("-._")
    derived = f"{head}-{suffix}"
    if not TENANT_RE.match(derived):  # only if the name held characters Kubernetes itself refuses
        derived = f"t-{_digest('tenant', namespace, name)[:_SUFFIX_LEN]}"
    return derived


def embedding_identity(model: ModelSpec, *, vllm: str) -> dict[str, Any]:
    """What decides an encoder's output: weights (name, revision, and where they are read from), dtype, the
    multimodal processor settings (they change the patches the encoder sees), and the vLLM that runs it (its
    kernels, and its own key namespace: 0.33 and 0.34 hash it differently)."""
    return {
        "vllm": vllm,
        "name": model.name,
        "revision": model.revision,
        "dtype": model.dtype,
        "weights": weights_location(model),
        "mm_processor_kwargs": dict(sorted(model.mm_processor_kwargs.items())),
    }


def kv_identity(model: ModelSpec, *, vllm: str) -> dict[str, Any]:
    """What decides a KV block beyond the tokens, which vLLM's block hash already covers: the weights, the
    dtype and the vLLM (its block layout and default block size differ). Processor settings are not here: they
    change the prompt tokens, hence the block hashes."""
    return {
        "vllm": vllm,
        "name": model.name,
        "revision": model.revision,
        "dtype": model.dtype,
        "weights": weights_location(model),
    }


def weights_location(model: ModelSpec) -> str:
    """Where the weights are read from: other weights may be there, so a move is a new identity even when the
    user keeps the name and revision."""
    source = model.source
    if source.image is not None:
        return f"image:{source.image.reference}"
    if source.host_path is not None:
        return f"hostPath:{source.host_path.path}"
    return f"pvc:{source.pvc.claim_name}" if source.pvc is not None else ""


def model_revision(model: ModelSpec, *, vllm: str) -> str:
    """What every vLLM pod carries as its revision label: a hash of all that decides its outputs (the encoder's
    identity, which covers the KV identity), so pods of one value may exchange embeddings and KV blocks and pods
    of two values may not."""
    return _identity_hash(REVISION_HEAD, embedding_identity(model, vllm=vllm))


def _identity_hash(head: str, identity: dict[str, Any]) -> str:
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return _digest(head, canonical)[:PREFIX_HASH_LEN]


def _prefix(head: str, identity: dict[str, Any]) -> str:
    return head + _identity_hash(head, identity)


def embedding_cache_prefix(model: ModelSpec, override: str | None = None, *, vllm: str) -> str:
    """spec.encoder.crossEncoderCache.prefix, else "emb-" + a hash of `embedding_identity`."""
    return override or _prefix(EMBEDDING_PREFIX_HEAD, embedding_identity(model, vllm=vllm))


def kv_cache_prefix(model: ModelSpec, override: str | None = None, *, vllm: str) -> str:
    """spec.store.kvCachePrefix, else "kv-" + a hash of `kv_identity`."""
    return override or _prefix(KV_PREFIX_HEAD, kv_identity(model, vllm=vllm))


def embedding_model_identity(model: ModelSpec) -> str:
    """The `model:` field of cross-encoder store keys: the model name, not the mount path, so pods that mount
    the same weights at different paths still share; '@' delimits key parts, so it is replaced."""
    return model.name.replace("@", "_")


def python_hash_seed(namespace: str, name: str) -> int:
    """One PYTHONHASHSEED per deployment (0..2**32-1, what Python accepts): every store sharer hashes KV
    blocks alike, and a restart keeps the seed, so blocks stored before it still match."""
    return int(_digest("pythonhashseed", namespace, name)[:8], 16)
