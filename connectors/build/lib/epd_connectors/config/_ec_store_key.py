"""Keys and value header of cross-encoder embedding objects in the Mooncake store (vLLM 0.33 format v3).

The operator and the tests need to predict the keys encoders write (to show the cache prefix in status, to
check a real store) without importing vLLM or torch. The format follows vLLM 0.33.0
(``ec_connector/mooncake_store_embedding``): the namespace is
``[prefix@]embedding@model:<id>@revision:<rev>@encoder:<mm config hash>@dtype:<dtype>@protocol:v3`` and a
key appends ``@id:<mm id>``; a value is a 24-byte little-endian header (``<IIQQ``: magic, dtype code, token
count, hidden size) followed by the contiguous 2D tensor bytes.
"""

from __future__ import annotations

import struct
from typing import Literal, NamedTuple

EMBEDDING_KEY_VERSION = "v3"
"""The format version in every key; encoders on different versions never share hits."""

EMBEDDING_VALUE_MAGIC = 0x4D4F4F4E
"""The header's first word ("MOON" read as a big-endian int; stored little-endian)."""

EMBEDDING_VALUE_HEADER = struct.Struct("<IIQQ")
"""Magic (u32), dtype code (u32), tokens (u64), hidden size (u64): 24 bytes."""

EMBEDDING_VALUE_HEADER_BYTES = EMBEDDING_VALUE_HEADER.size

# vLLM's model revision and encoder hash when none is configured (written literally into keys).
DEFAULT_REVISION = "default"
DEFAULT_ENCODER_HASH = "encoder:default"

EmbeddingDType = Literal["float32", "float16", "bfloat16"]
"""The only output dtypes that are shared; other outputs are encoded normally."""

# Codes are Mooncake's tensor dtype enumeration, as vLLM writes them.
_DTYPE_CODES: dict[EmbeddingDType, int] = {"float32": 0, "float16": 11, "bfloat16": 12}
_CODE_DTYPES: dict[int, EmbeddingDType] = {code: name for name, code in _DTYPE_CODES.items()}


class EmbeddingHeader(NamedTuple):
    """A decoded value header."""

    dtype: EmbeddingDType
    tokens: int
    hidden: int


def embedding_namespace(
    *,
    model: str,
    dtype: str,
    prefix: str = "",
    revision: str | None = None,
    encoder_hash: str | None = None,
) -> str:
    """The key namespace of one encoder configuration.

    ``model`` is ``embedding_model_identity`` or else the configured model path; ``dtype`` is the model
    dtype as vLLM prints it after resolution (``torch.bfloat16``); ``encoder_hash`` the multimodal config
    hash (vLLM writes ``encoder:default`` without a multimodal config); ``revision`` None means "default".
    """
    head = f"{prefix}@" if prefix else ""
    return (
        f"{head}embedding"
        f"@model:{model}"
        f"@revision:{revision or DEFAULT_REVISION}"
        f"@encoder:{encoder_hash if encoder_hash is not None else DEFAULT_ENCODER_HASH}"
        f"@dtype:{dtype}"
        f"@protocol:{EMBEDDING_KEY_VERSION}"
    )


def embedding_key(namespace: str, mm_id: str) -> str:
    """The store key of one multimodal item (its mm hash or caller-given uuid) in a namespace."""
    return f"{namespace}@id:{mm_id}"


def embedding_value_header(dtype: EmbeddingDType, tokens: int, hidden: int) -> bytes:
    """The 24 bytes that precede a 2D embedding tensor of shape (tokens, hidden) in the store."""
    if dtype not in _DTYPE_CODES:
        raise ValueError(f"dtype = {dtype!r}: is not shared across encoders. Fix: use one of {list(_DTYPE_CODES)}")
    if tokens < 0 or hidden < 0:
        raise ValueError(f"shape = {(tokens, hidden)!r}: is negative. Fix: give the tensor's real shape")
    return EMBEDDING_VALUE_HEADER.pack(EMBEDDING_VALUE_MAGIC, _DTYPE_CODES[dtype], tokens, hidden)


def parse_embedding_value_header(data: bytes) -> EmbeddingHeader:
    """Decode the header at the start of a stored value; ValueError when it is not one."""
    if len(data) < EMBEDDING_VALUE_HEADER_BYTES:
        raise ValueError(
            f"value = {len(data)} bytes: shorter than the {EMBEDDING_VALUE_HEADER_BYTES}-byte header. "
            "Fix: read the whole object"
        )
    magic, code, tokens, hidden = EMBEDDING_VALUE_HEADER.unpack_from(data)
    if magic != EMBEDDING_VALUE_MAGIC:
        raise ValueError(f"magic = {magic:#x}: not an embedding object. Fix: check the key's namespace")
    dtype = _CODE_DTYPES.get(code)
    if dtype is None:
        raise ValueError(f"dtype code = {code}: unknown. Fix: the writer uses a newer format; change the prefix")
    return EmbeddingHeader(dtype, tokens, hidden)


def embedding_value_size(dtype: EmbeddingDType, tokens: int, hidden: int) -> int:
    """Bytes a stored embedding occupies (header plus tensor); reads need a buffer at least this large."""
    itemsize = 4 if dtype == "float32" else 2
    return EMBEDDING_VALUE_HEADER_BYTES + tokens * hidden * itemsize
