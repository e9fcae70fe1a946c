"""`--probe-interval 0` (EPD_PROXY_PROBE_INTERVAL=0): the proxy never probes, and uses its instances as listed.

The cluster tests need it: their proxy discovers simulated pods whose addresses nothing may connect to.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from epd_connectors.config.roles import Role
from epd_connectors.proxy import cli
from epd_connectors.proxy.settings import Limits
from tests.proxy.harness import FAST, post_json, run, serving
from tests.proxy.stand_ins import StandIn, running

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


class CountingStandIn(StandIn):
    """A stand-in PD that counts the probes it gets."""

    probes: int = 0

    async def _health(self, request: web.Request) -> web.Response:
        self.probes += 1
        return await super()._health(request)


@pytest.mark.unit
def test_a_zero_interval_means_no_probing_and_members_start_healthy() -> None:
    assert Limits().probing and not Limits(probe_interval_s=0).probing
    app, _, _, _ = cli.build(["--pd", "http://p0:8000"], {"EPD_PROXY_PROBE_INTERVAL": "0"})
    assert not app.options.limits.probing
    assert [i.healthy for i in app.roster.instances(Role.PD)] == [True], "no probe will admit it"
    app, _, _, _ = cli.build(["--pd", "http://p0:8000"], {})
    assert [i.healthy for i in app.roster.instances(Role.PD)] == [False], "probing: the first probe admits"


def test_the_proxy_sends_no_probe_when_probing_is_off() -> None:
    """A stand-in whose /health fails: with probing it would be evicted; off, it is never asked and serves."""

    async def main() -> None:
        pd = CountingStandIn("pd0", health=503)
        async with running(pd):
            app, _, _, _ = cli.build(["--pd", pd.url, "--probe-interval", "0", "--connect-timeout", "1"], {})
            async with serving(app) as url, aiohttp.ClientSession() as session:
                app.prober.wake()  # what discovery calls on every change
                await asyncio.sleep(0.3)
                async with session.get(url + "/health") as r:
                    health = r.status
                status, body = await post_json(session, url + "/v1/chat/completions", CHAT)
        assert pd.probes == 0
        assert health == 200
        assert status == 200 and body["choices"][0]["message"]["content"] == "from pd0"

    run(main)


def test_the_control_a_probing_proxy_does_probe() -> None:
    """The same stand-in behind a probing proxy gets probed and evicted: the test above can fail."""

    async def main() -> None:
        pd = CountingStandIn("pd0", health=503)
        async with running(pd):
            app, _, _, _ = cli.build(["--pd", pd.url, "--probe-interval", str(FAST.limits.probe_interval_s)], {})
            async with serving(app) as url, aiohttp.ClientSession() as session:
                await asyncio.sleep(0.3)
                async with session.get(url + "/health") as r:
                    health = r.status
        assert pd.probes >= 1
        assert health == 503

    run(main)
