"""Cross-encoder store keys and value headers, byte for byte as vLLM 0.33 writes them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epd_connectors.config.ec_transfer import (
    EMBEDDING_VALUE_HEADER_BYTES,
    EmbeddingHeader,
    embedding_key,
    embedding_namespace,
    embedding_value_header,
    embedding_value_size,
    parse_embedding_value_header,
)

pytestmark = pytest.mark.unit


def test_namespace_and_key_format_v3() -> None:
    namespace = embedding_namespace(
        prefix="qwen-r1",
        model="/models/qwen2-vl",
        revision="abc123",
        encoder_hash="9f8e",
        dtype="torch.bfloat16",
    )
    assert namespace == (
        "qwen-r1@embedding@model:/models/qwen2-vl@revision:abc123@encoder:9f8e@dtype:torch.bfloat16@protocol:v3"
    )
    assert embedding_key(namespace, "img-1") == namespace + "@id:img-1"


def test_namespace_defaults_as_vllm_writes_them() -> None:
    # No prefix: no leading '@'; no revision: "default"; no multimodal config: the literal "encoder:default".
    assert embedding_namespace(model="m", dtype="torch.float16") == (
        "embedding@model:m@revision:default@encoder:encoder:default@dtype:torch.float16@protocol:v3"
    )


def test_header_layout() -> None:
    header = embedding_value_header("bfloat16", 4, 128)
    assert len(header) == EMBEDDING_VALUE_HEADER_BYTES == 24
    # Little-endian: magic 0x4D4F4F4E, dtype code 12 (bf16), tokens u64, hidden u64.
    assert header == bytes.fromhex("4e4f4f4d0c00000004000000000000008000000000000000")


@pytest.mark.parametrize(("dtype", "code"), [("float32", 0), ("float16", 11), ("bfloat16", 12)])
def test_dtype_codes(dtype: str, code: int) -> None:
    header = embedding_value_header(dtype, 1, 1)  # type: ignore[arg-type]
    assert header[4:8] == code.to_bytes(4, "little")


@given(st.sampled_from(["float32", "float16", "bfloat16"]), st.integers(0, 2**40), st.integers(0, 2**20))
def test_header_round_trips(dtype: str, tokens: int, hidden: int) -> None:
    header = embedding_value_header(dtype, tokens, hidden)  # type: ignore[arg-type]
    assert parse_embedding_value_header(header + b"tensor") == EmbeddingHeader(dtype, tokens, hidden)  # type: ignore[arg-type]


def test_header_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="shorter than the 24-byte header"):
        parse_embedding_value_header(b"\x00" * 10)
    with pytest.raises(ValueError, match="not an embedding object"):
        parse_embedding_value_header(b"\x00" * 24)
    bad_code = embedding_value_header("float32", 1, 1)[:4] + (7).to_bytes(4, "little") + b"\x00" * 16
    with pytest.raises(ValueError, match="dtype code = 7: unknown"):
        parse_embedding_value_header(bad_code)
    with pytest.raises(ValueError, match="is not shared across encoders"):
        embedding_value_header("int8", 1, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is negative"):
        embedding_value_header("float16", -1, 1)


def test_value_size_counts_the_header() -> None:
    assert embedding_value_size("float32", 4, 128) == 24 + 4 * 128 * 4
    assert embedding_value_size("bfloat16", 4, 128) == 24 + 4 * 128 * 2


@given(st.binary(max_size=64))
def test_arbitrary_bytes_parse_or_fail_cleanly(data: bytes) -> None:
    try:
        header = parse_embedding_value_header(data)
    except ValueError as exc:
        assert "Fix:" in str(exc)
    else:
        assert embedding_value_header(header.dtype, header.tokens, header.hidden) == data[:24]
