"""The Mooncake master dies under a running E + P + D (examples/local-e-p-d.yaml through the local runner) and is
started again the way a cluster does it: the same argv, bundle and ports (`LocalDeployment.restart`, what the
master's Deployment does with its pod). Nothing else is touched, and the deployment recovers by itself.

What the clients see (measured on this CPU build, vLLM 0.32.0, Mooncake 0.3.13, TCP):
- The store client's open RPC to the master fails at once ("RPC call failed: End of file"); its pings, about every
  5 s, fail, and after the third it tries to reconnect every ~10 s. Once the master is back it reconnects within
  about a second and mounts its segment again: the master's capacity is back, but the pool is empty (a master
  restart loses every key; no HA here).
- vLLM's MooncakeStoreConnector in the prefill (kv_both) and the decode (kv_consumer) raises nothing to anyone:
  each store lookup waits for Mooncake's -900 (master unreachable) for about 4.3 s, and the prefill's
  asynchronous batch_put fails with -900 ("batch_put failed: 1/1 keys failed (codes={-900}...)"), so the blocks
  of those requests are never stored. After the restart their next calls succeed; no vLLM process restarts.
- Requests during the outage are served, and correctly: the KV still moves prefill -> decode over MooncakeConnector
  (P2P), so the decode recomputes nothing; they are slower (measured 5-15 s instead of 0.3-4 s on a loaded box),
  because every lookup on the prefill and on the decode waits out the master's timeout first. No request fails.
- Requests after the restart are as before: equal to the baseline, and the prefill writes new blocks to the store
  again, under the deployment's KV prefix.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from epd_connectors import store_probe
from epd_connectors.config.roles import Role
from epd_operator.derive.site import LOOPBACK
from tests.e2e.conftest import TIMINGS, VllmInstance
from tests.e2e.test_local_e_p_d import (
    SETTLE_S,
    DecodeCounts,
    LocalEPD,
    ask,
    assert_the_decode_computed_no_prompt_token,
    chat,
    decode_counts_after,
    image,
    new_store_keys,
    running_example,
    text,
    tokens,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

RECOVER_S = 60.0
"""How long the store client may take to mount its segment on the restarted master (measured: about 1 s)."""
PUT_FAILED = "batch_put failed"
"""The prefill worker's warning when MooncakeStoreConnector could not store a request's blocks."""
MASTER_UNREACHABLE = "-900"


@pytest.fixture(scope="module")
def epd(
    request: pytest.FixtureRequest, e2e_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalEPD]:
    with running_example(request, e2e_python, tiny_model, tmp_path_factory.mktemp("e-p-d-restart"), "restart") as it:
        yield it


def fresh_prompt_lands_in_the_store(epd: LocalEPD, baseline: VllmInstance, seed: int, label: str) -> set[str]:
    """A new image and question through the proxy: equal to the baseline, no prompt token computed on the decode,
    and new keys under the KV prefix in the store (returned)."""
    keys_before = epd.store_keys()
    assert_served_like_the_baseline(epd, baseline, seed, label)
    return new_store_keys(epd, keys_before)


def assert_served_like_the_baseline(epd: LocalEPD, baseline: VllmInstance, seed: int, label: str) -> float:
    body = chat([image(seed), text(f"What do you see? ({label})")])
    expected = tokens(baseline.post("/v1/chat/completions", body))
    before = DecodeCounts.read(epd)
    begun = time.monotonic()
    got = ask(epd.plan.endpoint, body)
    took = time.monotonic() - begun
    TIMINGS.add(f"master restart: request {label}", took)
    assert got == expected, f"{label}: the deployment answered {got}, the baseline {expected}"
    assert_the_decode_computed_no_prompt_token(decode_counts_after(epd, before, 1), label)
    return took


def wait_for_log(epd: LocalEPD, role: Role, *needles: str) -> str:
    """The first line of the role's log holding every needle (the workers log asynchronously)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        for line in epd.log(role).splitlines():
            if all(needle in line for needle in needles):
                return line
        assert time.monotonic() < deadline, f"{role.value} never logged a line with {needles}"
        time.sleep(0.5)


def test_the_deployment_serves_through_a_master_restart_and_uses_the_store_again(
    epd: LocalEPD, baseline: VllmInstance
) -> None:
    master = epd.instance(Role.MASTER)
    client = epd.instance(Role.STORE_CLIENT)
    assert master.bundle.master is not None and client.bundle.store_client is not None
    segment = client.bundle.store_client.global_segment_size
    others = {run.name: run.popen.pid for run in epd.local.running if run.name != master.name}

    fresh_prompt_lands_in_the_store(epd, baseline, 40, "before the outage")
    assert epd.store_keys()

    epd.local.kill(master.name)
    assert_served_like_the_baseline(epd, baseline, 41, "while the master is down")
    assert "RPC call failed" in epd.log(Role.STORE_CLIENT), "the store client did not notice the master was gone"
    wait_for_log(epd, Role.PREFILL, PUT_FAILED, MASTER_UNREACHABLE)
    assert_served_like_the_baseline(epd, baseline, 40, "an earlier image, while the master is down")

    began = time.monotonic()
    epd.local.restart(master.name)
    metrics = master.bundle.master.metrics_url(LOOPBACK)
    assert store_probe.wait_for_capacity(metrics, at_least=segment, timeout_s=RECOVER_S) == segment
    TIMINGS.add("master restart: restart until the pool is mounted again", time.monotonic() - began)
    assert epd.store_keys() == set(), "keys survived the master restart (it keeps none without HA)"

    fresh_prompt_lands_in_the_store(epd, baseline, 42, "after the restart")
    assert_served_like_the_baseline(epd, baseline, 40, "an earlier image, after the restart")
    assert {run.name: run.popen.pid for run in epd.local.running if run.name != master.name} == others
    assert not epd.local.failed(), "a role died during the outage"
