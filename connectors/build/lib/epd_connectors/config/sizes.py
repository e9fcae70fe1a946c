"""Byte sizes as users write them ("80GB", "4 GiB", 1073741824) normalised to an int of bytes.

Mooncake and vLLM take byte counts; users copy sizes from their docs, which write "4 GB". Both readers
treat every unit as a power of 1024: Mooncake's ``string_to_byte_size`` (mooncake-store/include/utils.h,
used for ``mooncake_client --global_segment_size`` and ``--local_buffer_size``) reads K/KB, M/MB, G/GB and
T/TB as 1024**n, and vLLM's ``mooncake_store._parse_size`` reads kb/mb/gb as 1024**n. So "4 GB" here is
4 GiB, the number the processes themselves would compute. We also accept the binary spellings (KiB, Mi, ...)
that Kubernetes users write, which Mooncake does NOT understand: its parser returns 0 for "4 GiB", silently
giving a client no segment. So everything we render (JSON, argv, YAML) carries plain integers of bytes.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer

_KI = 1024
_UNITS = {
    "": 1,
    "B": 1,
    "K": _KI,
    "KB": _KI,
    "KI": _KI,
    "KIB": _KI,
    "M": _KI**2,
    "MB": _KI**2,
    "MI": _KI**2,
    "MIB": _KI**2,
    "G": _KI**3,
    "GB": _KI**3,
    "GI": _KI**3,
    "GIB": _KI**3,
    "T": _KI**4,
    "TB": _KI**4,
    "TI": _KI**4,
    "TIB": _KI**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*\Z", re.ASCII)  # ASCII: no other scripts' digits

MAX_SIZE = 2**63 - 1
"""Mooncake holds sizes in uint64 and its tenant ledger reserves the top bit; int64 max also fits every
C++ ``size_t``/``int64`` flag on the way."""

_FIX = "give bytes as an integer or a string like '80GB', '4 GiB' or '512Mi' (every unit is a power of 1024)"


def parse_size(value: object) -> int:
    """Bytes from an int or a string such as "80GB", "4 GiB", "512Mi"; raises ValueError naming the fix."""
    result: int | None = None
    if isinstance(value, bool):
        result = None  # True would silently mean one byte
    elif isinstance(value, int):
        result = value
    elif isinstance(value, float) and value.is_integer():
        result = int(value)
    elif isinstance(value, str):
        match = _SIZE.match(value)
        if match:
            number, unit = match.groups()
            factor = _UNITS.get(unit.upper())
            if factor is not None:
                result = _scale(number, factor)
    if result is None:
        raise ValueError(f"{value!r} is not a byte size. Fix: {_FIX}")
    if result < 0 or result > MAX_SIZE:
        raise ValueError(f"{value!r} is out of range: a size is 0 .. 2**63-1 bytes. Fix: {_FIX}")
    return result


def _scale(number: str, factor: int) -> int | None:
    """Exact integer arithmetic, so "1.5 GiB" is exact and "0.3 B" is refused rather than rounded."""
    whole, _, frac = number.partition(".")
    numerator = int(whole + frac) * factor
    denominator: int = 10 ** len(frac)
    if numerator % denominator:
        return None
    return numerator // denominator


def format_size(n: int) -> str:
    """The shortest exact binary spelling ("4 GiB"), or plain bytes when none is exact; for messages only."""
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= factor and n % factor == 0:
            return f"{n // factor} {unit}"
    return f"{n} B"


ByteSize = Annotated[int, BeforeValidator(parse_size), PlainSerializer(int, return_type=int)]
"""A field type: accepts bytes or a size string, always holds and serialises as an int of bytes."""
