"""The encode stage over HTTP: rewrite only with metadata, affinity, failover, batching, push targets."""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import replace
from typing import Any

import aiohttp

from epd_connectors.config.roles import Role
from epd_connectors.proxy.app import ProxyApp
from epd_connectors.proxy.flow import DP_RANK_HEADER
from epd_connectors.proxy.media import find_media
from epd_connectors.proxy.roster import InstanceSpec
from epd_connectors.proxy.routing import preference
from epd_connectors.proxy.settings import Limits
from tests.proxy.harness import FAST, data_url, roster_of, run, serving
from tests.proxy.stand_ins import StandIn, running


def chat(*urls: str, stream: bool = False) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": "describe"}]
    content += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return {"model": "tiny", "stream": stream, "messages": [{"role": "user", "content": content}]}


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, str]:
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        return response.status, await response.text()


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_an_image_the_encoder_reported_no_metadata_for_keeps_every_image_as_media() -> None:
    """Stand-in encoder: it can be told to report nothing for one image, which a real one does only on faults.
    vLLM refuses raw images and image references in one request, so neither image becomes a reference."""

    async def main() -> None:
        body = chat(data_url("one"), data_url("two"))
        skipped = find_media(body)[1].uuid
        enc, pd = StandIn("e0", role="encoder", no_metadata={skipped}), StandIn("pd0")
        async with running(enc, pd):
            app = ProxyApp(roster_of({Role.ENCODER: [enc], Role.PD: [pd]}), FAST)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                status, text = await post(session, url, body)
                metrics = await (await session.get(url + "/metrics")).text()
        assert status == 200 and "from pd0" in text
        assert 'epd_proxy_media_items_total{result="rewritten"} 0.0' in metrics
        assert 'epd_proxy_media_items_total{result="kept"} 2.0' in metrics
        sent = pd.requests[0]["messages"][0]["content"]
        assert [part["type"] for part in sent[1:]] == ["image_url", "image_url"]
        assert sent[2] == {"type": "image_url", "image_url": {"url": data_url("two")}, "uuid": skipped}
        assert len(enc.requests) == 1 and len(enc.requests[0]["messages"][0]["content"]) == 2

    run(main)


def test_text_only_requests_skip_the_encoders() -> None:
    """Stand-in backends: the check is which instance saw a request, not what a model computes."""

    async def main() -> None:
        enc, pd = StandIn("e0", role="encoder"), StandIn("pd0")
        async with running(enc, pd):
            app = ProxyApp(roster_of({Role.ENCODER: [enc], Role.PD: [pd]}), FAST)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                status, _ = await post(session, url, chat())
        assert status == 200 and enc.requests == [] and len(pd.requests) == 1
        assert "ec_transfer_params" not in pd.requests[0]

    run(main)


def test_a_repeated_image_meets_the_same_encoder_and_fails_over_in_its_order() -> None:
    """Stand-in encoders: one is stopped mid-run, as a killed encoder pod would be, to see the item move on."""

    async def main() -> None:
        encoders = [StandIn(f"e{i}", role="encoder") for i in range(3)]
        pd = StandIn("pd0")
        async with running(*encoders, pd):
            app = ProxyApp(roster_of({Role.ENCODER: encoders, Role.PD: [pd]}), FAST)
            uuid = find_media(chat(data_url("cat")))[0].uuid
            order = preference(uuid, [e.url for e in encoders])
            by_url = {e.url: e for e in encoders}
            async with serving(app) as url, aiohttp.ClientSession() as session:
                for _ in range(3):
                    assert (await post(session, url, chat(data_url("cat"))))[0] == 200
                assert len(by_url[order[0]].requests) == 3
                await by_url[order[0]].stop()
                assert (await post(session, url, chat(data_url("cat"))))[0] == 200
                assert len(by_url[order[1]].requests) == 1
                metrics = await (await session.get(url + "/metrics")).text()
        assert 'epd_proxy_encoder_affinity_total{result="hit"} 4.0' in metrics  # routing chose well; it failed after
        assert f'epd_proxy_retries_total{{instance="{order[0]}",role="encoder"}} 1.0' in metrics
        first = app.roster.get(Role.ENCODER, order[0])
        assert first is not None and not first.healthy, "an unreachable encoder leaves routing"

    run(main)


def test_an_encoder_5xx_is_retried_on_the_next_encoder() -> None:
    """Stand-in encoder told to answer 500 once (a real one does so only when broken)."""

    async def main() -> None:
        encoders = [StandIn(f"e{i}", role="encoder") for i in range(2)]
        pd = StandIn("pd0")
        async with running(*encoders, pd):
            uuid = find_media(chat(data_url("x")))[0].uuid
            first = preference(uuid, [e.url for e in encoders])[0]
            failing = next(e for e in encoders if e.url == first)
            failing.statuses = [500]
            app = ProxyApp(roster_of({Role.ENCODER: encoders, Role.PD: [pd]}), FAST)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                status, _ = await post(session, url, chat(data_url("x")))
        assert status == 200
        assert sum(len(e.requests) for e in encoders) == 2
        assert pd.requests[0]["messages"][0]["content"][1]["type"] == "image_embeds"

    run(main)


def test_all_encoders_down_is_a_clear_error() -> None:
    """No stand-in listens at the encoder's address: the connection is refused, as for a dead pod."""

    async def main() -> None:
        pd = StandIn("pd0")
        async with running(pd):
            roster = roster_of({Role.ENCODER: [dead_url()], Role.PD: [pd]})
            app = ProxyApp(roster, FAST, probe=False)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                status, text = await post(session, url, chat(data_url("x")))
                again, text2 = await post(session, url, chat(data_url("x")))
        assert status == 502 and "encoder" in text
        assert again == 503 and "no healthy encoder" in text2
        assert pd.requests == []

    run(main)


def test_items_are_batched_per_encoder_with_a_cap_and_sent_concurrently() -> None:
    """Stand-in encoder with a delay: five batches of one item finish in about one delay, not five."""

    async def main() -> None:
        enc, pd = StandIn("e0", role="encoder", delay_s=0.3), StandIn("pd0")
        options = replace(FAST, timeouts=FAST.timeouts, limits=Limits(encoder_batch_max=1, probe_interval_s=5))
        async with running(enc, pd):
            app = ProxyApp(roster_of({Role.ENCODER: [enc], Role.PD: [pd]}), options)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                started = time.perf_counter()
                status, _ = await post(session, url, chat(*(data_url(str(i)) for i in range(5))))
                elapsed = time.perf_counter() - started
        assert status == 200 and len(enc.requests) == 5 and elapsed < 1.2
        sent = pd.requests[0]["messages"][0]["content"]
        assert [p["type"] for p in sent[1:]] == ["image_embeds"] * 5

    run(main)


def test_push_connector_gets_the_consumer_replica_address_and_the_rank_header() -> None:
    """Stand-ins record what they were sent: the encoder's consumer_zmq must name the replica the PD request
    goes to (by X-data-parallel-rank), with matching transfer ids on both sides."""

    async def main() -> None:
        enc, pd = StandIn("e0", role="encoder"), StandIn("pd0")
        async with running(enc, pd):
            spec = InstanceSpec(pd.url, ("tcp://10.1.0.5:14579", "tcp://10.1.0.5:14580"))
            app = ProxyApp(roster_of({Role.ENCODER: [enc], Role.PD: [spec]}), FAST)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                for i in range(2):
                    assert (await post(session, url, chat(data_url(str(i)))))[0] == 200
        for n in range(2):
            ec = enc.requests[n]["ec_transfer_params"]
            assert ec["consumer_zmq"] == spec.ec_addresses[n]
            assert pd.headers[n][DP_RANK_HEADER] == str(n)
            items = pd.requests[n]["ec_transfer_params"]["ec_items"]
            assert [i["transfer_id"] for i in items] == [i["transfer_id"] for i in ec["ec_items"]]
            assert items[0]["mm_hash"] == pd.requests[n]["messages"][0]["content"][1]["uuid"]

    run(main)


def test_least_outstanding_spreads_concurrent_requests() -> None:
    """Slow stand-in PD instances: with two requests in flight each instance gets one."""

    async def main() -> None:
        pds = [StandIn(f"pd{i}", delay_s=0.3) for i in range(2)]
        async with running(*pds):
            app = ProxyApp(roster_of({Role.PD: pds}), FAST)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                results = await asyncio.gather(*(post(session, url, chat()) for _ in range(2)))
        assert [r[0] for r in results] == [200, 200]
        assert [len(p.requests) for p in pds] == [1, 1]

    run(main)


def test_without_affinity_media_spread_by_load() -> None:
    """Stand-in encoders: with affinity off, the same image goes to whichever encoder is least busy."""

    async def main() -> None:
        encoders = [StandIn(f"e{i}", role="encoder") for i in range(2)]
        pd = StandIn("pd0")
        options = replace(FAST, timeouts=FAST.timeouts, limits=FAST.limits, encoder_affinity=False)
        async with running(*encoders, pd):
            app = ProxyApp(roster_of({Role.ENCODER: encoders, Role.PD: [pd]}), options)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                for _ in range(4):
                    assert (await post(session, url, chat(data_url("same"))))[0] == 200
                metrics = await (await session.get(url + "/metrics")).text()
        assert [len(e.requests) for e in encoders] == [2, 2]
        assert "epd_proxy_encoder_affinity_total{" not in metrics

    run(main)


def test_concurrent_media_requests_spread_over_consumers_while_encoding() -> None:
    """Slow stand-in encoder: requests waiting for their media already count against the consumer they chose."""

    async def main() -> None:
        enc = StandIn("e0", role="encoder", delay_s=0.3)
        pds = [StandIn("pd0"), StandIn("pd1")]
        async with running(enc, *pds):
            app = ProxyApp(roster_of({Role.ENCODER: [enc], Role.PD: pds}), FAST)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                results = await asyncio.gather(*(post(session, url, chat(data_url(str(i)))) for i in range(4)))
        assert [r[0] for r in results] == [200] * 4
        assert [len(p.requests) for p in pds] == [2, 2]

    run(main)
