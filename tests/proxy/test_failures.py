"""Failures over HTTP: retry before the first byte, mid-stream error events, client disconnects, 400, 503,
4xx pass-through and stage timeouts."""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import replace
from typing import Any

import aiohttp

from epd_connectors.config.bundle import PROXY_LIVENESS_PATH
from epd_connectors.config.roles import Role
from epd_connectors.proxy import errors
from epd_connectors.proxy.app import ProxyApp
from epd_connectors.proxy.settings import Limits, Timeouts
from tests.proxy.harness import FAST, post_json, roster_of, run, serving
from tests.proxy.stand_ins import StandIn, running


def chat(stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "stream": stream, "messages": [{"role": "user", "content": "hi"}], **extra}


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_5xx_before_the_first_byte_is_retried_on_another_instance() -> None:
    """Stand-in PD instances, one told to answer 500: a real engine cannot be made to fail on demand."""

    async def main() -> None:
        pds = [StandIn("pd0", statuses=[500, 500]), StandIn("pd1")]
        async with running(*pds):
            app = ProxyApp(roster_of({Role.PD: pds}), FAST)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                for stream in (False, True, False, True):
                    async with session.post(url + "/v1/chat/completions", json=chat(stream)) as r:
                        text = await r.text()
                        assert r.status == 200, text
                metrics = await (await session.get(url + "/metrics")).text()
        assert pds[0].statuses == [], "both 500s were answered, and both requests went on to pd1"
        assert sum(len(p.requests) for p in pds) == 6, "four requests, two of them tried twice"
        assert f'epd_proxy_retries_total{{instance="{pds[0].url}",role="pd"}} 2.0' in metrics

    run(main)


def test_connect_errors_are_retried_and_the_dead_instance_is_evicted() -> None:
    """One address has no stand-in at all (connection refused, like a deleted pod)."""

    async def main() -> None:
        live = StandIn("pd1")
        async with running(live):
            dead = dead_url()
            app = ProxyApp(roster_of({Role.PD: [dead, live]}), FAST, probe=False)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                for _ in range(3):
                    async with session.post(url + "/v1/chat/completions", json=chat()) as r:
                        assert r.status == 200
        instance = app.roster.get(Role.PD, dead)
        assert instance is not None and not instance.healthy
        assert len(live.requests) == 3

    run(main)


def test_retries_are_bounded() -> None:
    """Stand-ins that always answer 500: the client gets the last error after 1 + retries attempts."""

    async def main() -> None:
        pds = [StandIn(f"pd{i}", statuses=[500] * 5) for i in range(4)]
        options = replace(FAST, timeouts=FAST.timeouts, limits=Limits(retries=1, probe_interval_s=5))
        async with running(*pds):
            app = ProxyApp(roster_of({Role.PD: pds}), options)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                status, body = await post_json(session, url + "/v1/chat/completions", chat())
        assert sum(len(p.requests) for p in pds) == 2
        # It names the backend and what it said (its error body's message, as vLLM's "EngineCore encountered an
        # issue" would be), not the raw JSON.
        assert status == 502 and body["error"]["message"] in {
            f"pd {p.url}/v1/chat/completions answered 500: {p.name} says 500" for p in pds if p.requests
        }, body

    run(main)


def test_a_failure_mid_stream_ends_the_stream_with_an_error_event() -> None:
    """Stand-in PD that drops the connection after one chunk (a crashed engine mid-generation)."""

    async def main() -> None:
        pd = StandIn("pd0", chunks=5, cut_after=1)
        async with running(pd):
            app = ProxyApp(roster_of({Role.PD: [pd]}), FAST)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                async with session.post(url + "/v1/chat/completions", json=chat(True)) as r:
                    status, text = r.status, await r.text()
                metrics = await (await session.get(url + "/metrics")).text()
        events = [e.removeprefix("data: ") for e in text.strip().split("\n\n")]
        assert status == 200
        assert "pd0-0" in events[0]
        assert json.loads(events[-2])["error"]["type"] == "bad_gateway"
        assert events[-1] == "[DONE]"
        assert len(pd.requests) == 1, "nothing is retried once bytes reached the client"
        assert 'kind="mid_stream"' in metrics

    run(main)


def test_a_client_that_disconnects_cancels_its_backend_request() -> None:
    """Stand-in PD that takes 5 s and notices when the proxy hangs up on it (vLLM aborts then)."""

    async def main() -> None:
        pd = StandIn("pd0", delay_s=5)
        async with running(pd):
            app = ProxyApp(roster_of({Role.PD: [pd]}), FAST)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                try:
                    async with asyncio.timeout(0.3):
                        await session.post(url + "/v1/chat/completions", json=chat())
                except TimeoutError:
                    pass
                await asyncio.wait_for(pd.disconnected.wait(), 3)
                for _ in range(100):
                    if app.roster.instances()[0].outstanding == 0:
                        break
                    await asyncio.sleep(0.01)
                pd.delay_s = 0
                status, _ = await post_json(session, url + "/v1/chat/completions", chat())
                metrics = await (await session.get(url + "/metrics")).text()
        assert app.roster.instances()[0].outstanding == 0
        assert status == 200
        assert 'epd_proxy_requests_total{endpoint="/v1/chat/completions",status="499"} 1.0' in metrics
        assert 'status="200"} 1.0' in metrics, "a completed response is not taken for a disconnect"

    run(main)


def test_malformed_requests_get_400_with_a_message() -> None:
    """Stand-in PD only to have a roster; none of these requests may reach it."""

    async def main() -> None:
        pd = StandIn("pd0")
        async with running(pd):
            app = ProxyApp(roster_of({Role.PD: [pd]}), FAST)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                cases: list[tuple[str, bytes]] = [
                    ("/v1/chat/completions", b"{not json"),
                    ("/v1/chat/completions", b"[]"),
                    ("/v1/chat/completions", json.dumps({"model": "m"}).encode()),
                    ("/v1/completions", json.dumps({"model": "m"}).encode()),
                    (
                        "/v1/chat/completions",
                        json.dumps(
                            {"messages": [{"role": "user", "content": [{"type": "image_embeds", "image_embeds": {}}]}]}
                        ).encode(),
                    ),
                ]
                for path, raw in cases:
                    async with session.post(url + path, data=raw) as r:
                        body = await r.json()
                        assert r.status == 400, (raw, body)
                        assert body["error"]["message"]
        assert pd.requests == []

    run(main)


def test_no_healthy_instance_is_503_and_health_says_which_role() -> None:
    """Stand-in PD whose /health answers 503: the prober evicts it; a request then has nowhere to go. The proxy's
    own liveness answers all along."""

    async def main() -> None:
        pd = StandIn("pd0", health=503)
        options = replace(FAST, timeouts=FAST.timeouts, limits=Limits(probe_interval_s=0.05, evict_after=1))
        async with running(pd):
            app = ProxyApp(roster_of({Role.PD: [pd]}), options)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                async with session.post(url + "/v1/chat/completions", json=chat()) as r:
                    status, body, retry_after = r.status, await r.json(), r.headers.get("retry-after")
                async with session.get(url + "/health") as r:
                    health_status, health = r.status, await r.json()
                async with session.get(url + PROXY_LIVENESS_PATH) as r:
                    live = r.status
                pd.health = 200
                await asyncio.sleep(0.3)
                async with session.get(url + "/health") as r:
                    recovered = r.status
        assert status == 503 and "no healthy pd" in body["error"]["message"]
        assert retry_after == str(errors.RETRY_AFTER_S)
        assert health_status == 503 and health["roles"] == {"pd": False}
        assert live == 200, "liveness follows the backends: a kubelet would restart a proxy that only waits"
        assert recovered == 200
        assert pd.requests == []

    run(main)


def test_a_request_whose_only_instance_goes_away_is_503_with_retry_after_not_502() -> None:
    """The only PD goes (connection refused, as a deleted pod's address): the request that found it gone is told
    to come back (503, Retry-After), as every request after it is; a PD that answers 500 while it is still healthy
    stays a 502 (another attempt may pass)."""

    async def main() -> None:
        broken = StandIn("pd1", statuses=[500] * 8)
        async with running(broken):
            dead = dead_url()
            answers = []
            for pds in ([dead], [broken]):
                app = ProxyApp(roster_of({Role.PD: pds}), FAST, probe=False)
                async with serving(app) as url, aiohttp.ClientSession() as session:
                    for _ in range(2):
                        async with session.post(url + "/v1/chat/completions", json=chat()) as r:
                            answers.append(
                                (r.status, r.headers.get("retry-after"), (await r.json())["error"]["message"])
                            )
        (first, second, failing, _) = answers
        assert (
            first[:2] == (503, str(errors.RETRY_AFTER_S)) and "no healthy pd" in first[2] and "unreachable" in first[2]
        )
        assert second[:2] == (503, str(errors.RETRY_AFTER_S))
        assert failing[:2] == (502, None)

    run(main)


def test_a_4xx_from_the_backend_is_passed_through_not_retried() -> None:
    """Stand-in PD told to answer 400 (as vLLM does for a prompt longer than the model allows)."""

    async def main() -> None:
        pds = [StandIn("pd0", statuses=[400]), StandIn("pd1", statuses=[400])]
        async with running(*pds):
            app = ProxyApp(roster_of({Role.PD: pds}), FAST)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                status, body = await post_json(session, url + "/v1/chat/completions", chat())
        assert status == 400 and "says 400" in body["error"]["message"]
        assert sum(len(p.requests) for p in pds) == 1

    run(main)


def test_first_token_timeout_moves_on_then_gives_504() -> None:
    """Stand-in PD instances that stall longer than the first-token timeout."""

    async def main() -> None:
        pds = [StandIn("pd0", delay_s=3), StandIn("pd1", delay_s=3)]
        options = replace(
            FAST,
            timeouts=Timeouts(connect=1, encode=1, prefill=1, first_token=0.3, total=10, probe=1),
            limits=Limits(retries=1, probe_interval_s=5),
        )
        async with running(*pds):
            app = ProxyApp(roster_of({Role.PD: pds}), options)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                status, body = await post_json(session, url + "/v1/chat/completions", chat())
        assert status == 504 and body["error"]["type"] == "timeout"

    run(main)


def test_a_stream_that_stalls_mid_way_ends_with_a_timeout_event() -> None:
    """Stand-in PD that sends its first chunk at once, then waits longer than the first-token limit (which is
    also the limit on the gap between chunks)."""

    async def main() -> None:
        pd = StandIn("pd0", chunks=5, chunk_delay_s=2.0)
        options = replace(
            FAST,
            timeouts=Timeouts(connect=1, encode=1, prefill=1, first_token=0.3, total=10, probe=1),
            limits=Limits(probe_interval_s=5),
        )
        async with running(pd):
            app = ProxyApp(roster_of({Role.PD: [pd]}), options)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                started = asyncio.get_running_loop().time()
                async with session.post(url + "/v1/chat/completions", json=chat(True)) as r:
                    status, text = r.status, await r.text()
                took = asyncio.get_running_loop().time() - started
        events = [e.removeprefix("data: ") for e in text.strip().split("\n\n")]
        assert status == 200 and "pd0-0" in events[0]
        error = json.loads(events[-2])["error"]
        assert error["type"] == "timeout" and "stalled for 0.3 s mid-stream" in error["message"]
        assert events[-1] == "[DONE]"
        assert took < 1.5, f"the stall was noticed after {took:.2f} s"

    run(main)
