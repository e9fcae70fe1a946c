"""docs/troubleshooting.md explains every reason the operator sets, on a condition, an Event or a pod's gate, and
no reason it no longer sets. The reasons are read from the operator's source, in each form it spells one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "troubleshooting.md"
SOURCE = ROOT / "operator" / "src" / "epd_operator"
SPELLINGS = (
    r'REASON_\w+ = "(\w+)"',  # status.py's constants
    r'reason="(\w+)"',  # Events posted with a literal reason
    r'"reason": "(\w+)"',  # the revision gate's pod condition
    r'reason = "(\w+)" if',  # repairs: Restored or Reverted
    r'reason = "\w+" if .* else "(\w+)"',
    r'reason = "[^"]*", "(\w+)"',  # a (message, reason) pair
    # transfer_health.verdict's (status, reason, message)
    r'"(?:True|False|Unknown)",\s*"((?!True\b|False\b|Unknown\b)\w+)",',
    r'StoreEvent\(\s*"(?:info|warn)",\s*"(\w+)"',
)


def reasons_in_source() -> set[str]:
    text = "\n".join(p.read_text() for p in sorted(SOURCE.rglob("*.py")))
    return {found for spelling in SPELLINGS for found in re.findall(spelling, text)}


def reasons_in_doc() -> set[str]:
    headings = [line for line in DOC.read_text().splitlines() if line.startswith("### ")]
    return {name for line in headings for name in re.findall(r"`(\w+)`", line)}


def test_every_reason_the_operator_sets_is_explained_and_no_other() -> None:
    source = reasons_in_source()
    assert {"InvalidSpec", "TransferFailing", "StoreLeader", "Reverted", "Restored", "NotRead"} <= source
    assert source - reasons_in_doc() == set(), "explain these in docs/troubleshooting.md"
    assert reasons_in_doc() - source == set(), "docs/troubleshooting.md explains reasons the operator never sets"
