"""Byte sizes: the spellings users copy from Mooncake and Kubernetes docs all read as Mooncake reads them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from epd_connectors.config.sizes import MAX_SIZE, ByteSize, format_size, parse_size

pytestmark = pytest.mark.unit

GiB = 1024**3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GB", 80 * GiB),
        ("4 GiB", 4 * GiB),
        ("4 GB", 4 * GiB),  # Mooncake's string_to_byte_size and vLLM's _parse_size: GB is 1024**3
        ("4gb", 4 * GiB),
        ("512Mi", 512 * 1024**2),
        ("16MB", 16 * 1024**2),
        ("64 KiB", 64 * 1024),
        ("1K", 1024),
        ("2T", 2 * 1024**4),
        ("1.5 GiB", 3 * GiB // 2),
        ("1073741824", GiB),
        (" 7 B ", 7),
        ("0", 0),
        (1073741824, GiB),
        (0, 0),
        (2048.0, 2048),
    ],
)
def test_parses_sizes(text: object, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "bad",
    ["", "GB", "4 XB", "-1", "1.3 B", "4 GB extra", "1e9", True, None, 1.5, -5, 2**63, [], "0x10", "٣GB", "4GB\nx"],
)
def test_refuses_what_is_not_a_size(bad: object) -> None:
    with pytest.raises(ValueError, match=r"Fix: give bytes as an integer"):
        parse_size(bad)


def test_byte_size_field_holds_and_serialises_int() -> None:
    adapter = TypeAdapter(ByteSize)
    assert adapter.validate_python("4 GiB") == 4 * GiB
    assert adapter.dump_python(adapter.validate_python("1 MiB")) == 1024**2
    with pytest.raises(ValidationError, match="not a byte size"):
        adapter.validate_python("four gigs")


@given(st.integers(min_value=0, max_value=MAX_SIZE))
def test_format_then_parse_is_exact(n: int) -> None:
    assert parse_size(format_size(n)) == n
    assert parse_size(str(n)) == n


@given(st.one_of(st.text(max_size=20), st.floats(), st.integers(), st.booleans(), st.none()))
def test_arbitrary_input_is_an_int_or_a_value_error(value: object) -> None:
    try:
        result = parse_size(value)
    except ValueError as exc:
        assert "Fix:" in str(exc)
    else:
        assert isinstance(result, int)
        assert 0 <= result <= MAX_SIZE
