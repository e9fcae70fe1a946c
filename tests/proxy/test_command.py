"""`epd-proxy` as a process, through the `local_proxy` seam the real-vLLM tests use, and from a bundle."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from epd_connectors.config.bundle import Endpoint, Peers, PrefillEndpoint, ProxySettings, RoleBundle
from epd_connectors.config.roles import Role
from epd_connectors.proxy import cli
from epd_connectors.proxy.local import local_proxy
from tests.proxy.harness import data_url, post_json, run
from tests.proxy.stand_ins import StandIn, running

CHAT = {
    "model": "tiny",
    "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url("1")}}]}],
}


async def _enter(**kwargs: Any) -> tuple[Any, Any]:
    context = local_proxy(**kwargs)
    proxy = await asyncio.to_thread(context.__enter__)
    return context, proxy


def test_local_proxy_runs_the_command_in_front_of_given_urls() -> None:
    """Stand-in encoder and PD in this process; the proxy is the real `epd-proxy` in its own process, as the
    end-to-end tests run it in front of real vLLM."""

    async def main() -> None:
        enc, pd = StandIn("e0", role="encoder"), StandIn("pd0")
        async with running(enc, pd):
            context, proxy = await _enter(encoders=[enc.url], pd=[pd.url], ready_timeout_s=30)
            try:
                async with aiohttp.ClientSession() as session:
                    status, body = await post_json(session, proxy.url + "/v1/chat/completions", CHAT)
            finally:
                await asyncio.to_thread(context.__exit__, None, None, None)
        assert status == 200 and body["choices"][0]["message"]["content"] == "from pd0"
        assert pd.requests[0]["messages"][0]["content"][0]["type"] == "image_embeds"
        assert proxy.process.returncode is not None

    run(main)


def test_the_bundle_gives_listener_roster_and_affinity(tmp_path: Path) -> None:
    """No backend is needed to build the app from a bundle (the addresses are only parsed)."""
    bundle = RoleBundle(
        deployment="demo",
        role=Role.PROXY,
        proxy=ProxySettings(host="127.0.0.1", port=9123, encoder_affinity=False),
        peers=Peers(
            encoders=[Endpoint(host="demo-encoder", port=8000)],
            prefill=[PrefillEndpoint(host="demo-prefill", port=8000)],
            decode=[Endpoint(host="demo-decode", port=8000)],
            ec_consumers=["tcp://demo-prefill:14579"],
        ),
    )
    path = tmp_path / "bundle.json"
    path.write_text(bundle.to_json())
    app, host, port, _ = cli.build(["--bundle", str(path), "--prefill-bootstrap-port", "8998"])
    assert (host, port) == ("127.0.0.1", 9123)
    assert not app.options.encoder_affinity
    assert app.roster.roles == {Role.ENCODER, Role.PREFILL, Role.DECODE}
    prefill = app.roster.instances(Role.PREFILL)[0].spec
    assert prefill.ec_addresses == ("tcp://demo-prefill:14579",)
    assert prefill.bootstrap_url == "http://demo-prefill:8998"
    with pytest.raises(SystemExit, match="no decode or pd"):
        cli.build(["--encoder", "http://e:1"])
    assert urlsplit(app.roster.instances(Role.DECODE)[0].url).hostname == "demo-decode"


def test_flags_can_come_from_the_environment() -> None:
    """A proxy started by hand: EPD_PROXY_* fill what the command line leaves out. No backend needed."""
    environ = {
        "EPD_PROXY_PD": "http://p0:8000,http://p1:8000",
        "EPD_PROXY_KV_PROTOCOL": "mooncake",
        "EPD_PROXY_NO_ENCODER_AFFINITY": "true",
        "EPD_PROXY_RETRIES": "5",
    }
    app, _, _, _ = cli.build([], environ)
    assert [i.url for i in app.roster.instances(Role.PD)] == ["http://p0:8000", "http://p1:8000"]
    assert app.options.kv_protocol.value == "mooncake"
    assert not app.options.encoder_affinity and app.options.limits.retries == 5
    app, _, _, _ = cli.build(["--retries", "1"], environ)
    assert app.options.limits.retries == 1, "the command line wins"
    app, _, _, _ = cli.build(["--pd", "http://p2:8000", "--pd", "http://p3:8000"], environ)
    urls = [i.url for i in app.roster.instances(Role.PD)]
    assert urls == ["http://p2:8000", "http://p3:8000"], "a repeated flag on the command line replaces the env's list"
    app, _, _, _ = cli.build([], environ)
    assert len(app.roster.instances(Role.PD)) == 2, "the env's list is not changed by an earlier parse"
