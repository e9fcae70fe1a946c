"""store_probe's waits end on time, with a message naming what was awaited and what was seen."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from epd_connectors import store_probe

from .conftest import LOOPBACK, free_port

if TYPE_CHECKING:
    from .conftest import Mooncake

pytestmark = pytest.mark.store


def test_wait_for_master_gives_up_at_its_deadline() -> None:
    url = f"http://{LOOPBACK}:{free_port()}/health"
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=rf"Mooncake master not healthy at {url} after 0 s"):
        store_probe.wait_for_master(url, timeout_s=0.3)
    assert time.monotonic() - start < 3


def test_wait_for_capacity_reports_what_it_saw(mooncake: Mooncake) -> None:
    master = mooncake.master()
    with pytest.raises(TimeoutError, match=r"holds 0 bytes after 0 s, expected at least 1"):
        store_probe.wait_for_capacity(master.metrics_url, 1, timeout_s=0.2)
    mooncake.client(master, global_segment_size="32 MiB")
    assert store_probe.wait_for_capacity(master.metrics_url, 32 * 1024**2, timeout_s=5) == 32 * 1024**2
