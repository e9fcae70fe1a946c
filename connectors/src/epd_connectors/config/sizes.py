"""Byte sizes as users write them ("80GB", "4 GiB", 1073741824) normalised to an int of bytes.

Mooncake and vLLM take plain byte counts; users copy sizes from docs that write "4 GB". Decimal units are
powers of 1000 and binary units powers of 1024, as Mooncake's own parser reads them.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer

_UNITS = {
    "": 1,
    "B": 1,
    "K": 1000,
    "KB": 1000,
    "M": 1000**2,
    "MB": 1000**2,
    "G": 1000**3,
    "GB": 1000**3,
    "T": 1000**4,
    "TB": 1000**4,
    "KI": 1024,
    "KIB": 1024,
    "MI": 1024**2,
    "MIB": 1024**2,
    "GI": 1024**3,
    "GIB": 1024**3,
    "TI": 1024**4,
    "TIB": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(value: object) -> int:
    """Bytes from an int or a string such as "80GB", "4 GiB", "512Mi"; raises ValueError naming the fix."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size. Fix: give bytes as an integer or a string like '4 GiB'")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match:
            number, unit = match.groups()
            factor = _UNITS.get(unit.upper())
            if factor is not None:
                result = float(number) * factor
                if result.is_integer():
                    return int(result)
    raise ValueError(
        f"{value!r} is not a size. Fix: give bytes as an integer or a string like '80GB', '4 GiB' or '512Mi'"
    )


def format_size(n: int) -> str:
    """The shortest exact binary spelling ("4 GiB"), or plain bytes when none is exact."""
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= factor and n % factor == 0:
            return f"{n // factor} {unit}"
    return f"{n} B"


ByteSize = Annotated[int, BeforeValidator(parse_size), PlainSerializer(int, return_type=int)]
"""A field type: accepts bytes or a size string, always holds and serialises as an int of bytes."""
