"""The repair pacer: a burst at once, then one turn per interval, per child."""

from __future__ import annotations

import pytest

from epd_operator.pacing import Pacer

pytestmark = pytest.mark.unit


def test_a_burst_goes_at_once_then_turns_are_spaced() -> None:
    pacer = Pacer(burst=3, interval_s=10.0)
    assert [pacer.wait("cm", 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert pacer.wait("cm", 0.0) == 10.0
    assert pacer.wait("cm", 0.0) == 20.0, "turns already promised count"
    assert pacer.wait("svc", 0.0) == 0.0, "each child has its own bucket"


def test_tokens_come_back_with_time_up_to_the_burst() -> None:
    pacer = Pacer(burst=2, interval_s=10.0)
    pacer.wait("cm", 0.0), pacer.wait("cm", 0.0)
    assert pacer.wait("cm", 5.0) == 5.0
    assert pacer.wait("cm", 1000.0) == 0.0 and pacer.wait("cm", 1000.0) == 0.0
    assert pacer.wait("cm", 1000.0) == 10.0, "an idle hour refills the burst, no more"


def test_forget_starts_over() -> None:
    pacer = Pacer(burst=1, interval_s=10.0)
    pacer.wait("cm", 0.0)
    pacer.forget(["cm", "never-seen"])
    assert pacer.wait("cm", 0.0) == 0.0
