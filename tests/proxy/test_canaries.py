"""Canaries over HTTP: each transfer path is proven, a failing pair leaves routing, a repaired one returns.

The stand-in consumers and decodes fail a request whose embeddings or KV come from a sender they are told they
cannot be reached from, after a short wait, as vLLM does when a push never arrives (its 500 after
push_wait_timeout_s). The same case on real vLLM and real pods, with the path blocked in the consumer pod's
network namespace, is tests/e2e/pods/test_e_p_d.py.
"""

from __future__ import annotations

import asyncio
from base64 import b64encode
from typing import Any

import aiohttp

from epd_connectors.config.bundle import KVProtocol
from epd_connectors.config.roles import Role
from epd_connectors.proxy.app import ProxyApp
from epd_connectors.proxy.canary import REQUEST_ID_PREFIX
from epd_connectors.proxy.roster import InstanceSpec
from epd_connectors.proxy.settings import Canary, ProxyOptions
from epd_operator.transfer_health import verdict
from epd_operator.transfer_watch import read_proxy
from tests.proxy.harness import FAST, roster_of, run, serving
from tests.proxy.stand_ins import StandIn, running

CANARY = Canary(interval_s=60.0, retry_s=0.1, timeout_s=2.0, failures=2)
OPTIONS = ProxyOptions(timeouts=FAST.timeouts, limits=FAST.limits, canary=CANARY)


def image_chat(seed: int) -> dict[str, Any]:
    url = "data:image/png;base64," + b64encode(f"image {seed}".encode()).decode()
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "what is it?"}]
    return {"model": "tiny", "messages": [{"role": "user", "content": content}]}


async def transfers(session: aiohttp.ClientSession, url: str) -> dict[tuple[str, str], dict[str, Any]]:
    async with session.get(url + "/health") as answer:
        health = await answer.json()
    return {(t["from"], t["to"]): t for t in health["transfers"]}


async def until(session: aiohttp.ClientSession, url: str, states: dict[tuple[str, str], str]) -> dict[Any, Any]:
    """The proxy's transfer report once each named pair is in its state (20 s at most: two canaries that each
    wait out a 2 s limit take about 5 s on an idle machine, longer on a loaded one)."""
    for _ in range(400):
        report = await transfers(session, url)
        if all(report.get(pair, {}).get("state") == state for pair, state in states.items()):
            return report
        await asyncio.sleep(0.05)
    raise AssertionError(f"not {states}: {report}")


def request_id(headers: dict[str, str]) -> str:
    return next(v for k, v in headers.items() if k.lower() == "x-request-id")


def users(instance: StandIn) -> list[dict[str, Any]]:
    """The requests an instance got from clients (not from canaries)."""
    return [
        body
        for body, headers in zip(instance.requests, instance.headers, strict=True)
        if not request_id(headers).startswith(REQUEST_ID_PREFIX)
    ]


def producers(instance: StandIn) -> set[str]:
    return {StandIn._sender(body) or "" for body in users(instance)}


def test_an_encoder_whose_pushes_do_not_reach_a_consumer_is_kept_apart_from_it_until_the_path_works() -> None:
    async def main() -> None:
        e0, e1 = StandIn("e0", role="encoder"), StandIn("e1", role="encoder")
        pd0, pd1 = StandIn("pd0"), StandIn("pd1", unreachable_from={"e1"})
        async with running(e0, e1, pd0, pd1):
            app = ProxyApp(roster_of({Role.ENCODER: [e0, e1], Role.PD: [pd0, pd1]}), OPTIONS)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                report = await until(
                    session,
                    url,
                    {(e1.url, pd1.url): "failing", (e0.url, pd1.url): "ok", (e1.url, pd0.url): "ok"},
                )
                broken = report[e1.url, pd1.url]
                assert broken["path"] == "ec" and broken["from_role"] == "encoder" and broken["to_role"] == "pd"
                assert broken["failures"] >= CANARY.failures and "500" in broken["error"], broken
                assert report[e0.url, pd0.url]["state"] == "ok" and report[e0.url, pd0.url]["latency_ms"] > 0
                # Every canary carried a fresh image: no two sent to the encoders alike.
                canary_images = [str(b["messages"]) for b in e0.requests + e1.requests]
                assert len(set(canary_images)) == len(canary_images)

                for seed in range(24):
                    async with session.post(url + "/v1/chat/completions", json=image_chat(seed)) as answer:
                        assert answer.status == 200, await answer.text()
                assert users(pd1) and users(pd0) and users(e1), "both consumers and both encoders serve users"
                assert producers(pd1) == {"e0"}, "no user request went from e1 to pd1"
                metrics = await (await session.get(url + "/metrics")).text()
                assert 'epd_proxy_transfer_pairs{path="ec",state="failing"} 1.0' in metrics
                assert 'epd_proxy_transfer_pairs{path="ec",state="ok"} 3.0' in metrics

                pd1.unreachable_from.clear()  # the path is repaired: the next canary finds it
                await until(session, url, {(e1.url, pd1.url): "ok"})
                before = len(users(pd1))
                for seed in range(24, 64):
                    async with session.post(url + "/v1/chat/completions", json=image_chat(seed)) as answer:
                        assert answer.status == 200, await answer.text()
                assert "e1" in {StandIn._sender(b) for b in users(pd1)[before:]}, "e1 -> pd1 serves users again"

    run(main)


def test_a_consumer_no_encoder_reaches_gets_no_media_request_and_text_still_goes_there() -> None:
    async def main() -> None:
        e0 = StandIn("e0", role="encoder")
        pd0, pd1 = StandIn("pd0"), StandIn("pd1", unreachable_from={"e0"})
        async with running(e0, pd0, pd1):
            app = ProxyApp(roster_of({Role.ENCODER: [e0], Role.PD: [pd0, pd1]}), OPTIONS)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                await until(session, url, {(e0.url, pd1.url): "failing", (e0.url, pd0.url): "ok"})
                for seed in range(8):
                    async with session.post(url + "/v1/chat/completions", json=image_chat(seed)) as answer:
                        assert answer.status == 200
                text = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
                for _ in range(8):
                    async with session.post(url + "/v1/chat/completions", json=text) as answer:
                        assert answer.status == 200
        assert len(users(pd0)) >= 8 and users(pd1), "text requests still spread over both"
        assert all("ec_transfer_params" not in body for body in users(pd1)), "no media request went to pd1"

    run(main)


def test_with_every_pair_of_the_only_consumer_failing_requests_are_still_sent_there() -> None:
    """Canaries steer requests to a working pair; where there is none, a request is not refused on the
    canaries' word: it goes through and gets what the consumer answers (here its failure, retried nowhere)."""

    async def main() -> None:
        e0, pd0 = StandIn("e0", role="encoder"), StandIn("pd0", unreachable_from={"e0"})
        async with running(e0, pd0):
            app = ProxyApp(roster_of({Role.ENCODER: [e0], Role.PD: [pd0]}), OPTIONS)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                await until(session, url, {(e0.url, pd0.url): "failing"})
                async with session.post(url + "/v1/chat/completions", json=image_chat(1)) as answer:
                    failed = answer.status
                pd0.unreachable_from.clear()
                async with session.post(url + "/v1/chat/completions", json=image_chat(2)) as answer:
                    served = answer.status
        assert failed == 502 and served == 200
        assert len(users(pd0)) == 2 and len(users(e0)) == 2

    run(main)


def test_a_prefill_whose_kv_does_not_reach_a_decode_is_kept_apart_from_it() -> None:
    async def main() -> None:
        prefill = StandIn("p0")
        d0, d1 = StandIn("d0"), StandIn("d1", unreachable_from={"p0"})
        async with running(prefill, d0, d1):
            spec = InstanceSpec(prefill.url, bootstrap_url=prefill.url)
            roster = roster_of({Role.PREFILL: [spec], Role.DECODE: [d0, d1]})
            options = ProxyOptions(
                timeouts=FAST.timeouts, limits=FAST.limits, canary=CANARY, kv_protocol=KVProtocol.MOONCAKE
            )
            app = ProxyApp(roster, options)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                report = await until(session, url, {(prefill.url, d1.url): "failing", (prefill.url, d0.url): "ok"})
                assert report[prefill.url, d1.url]["path"] == "kv"
                text = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
                for _ in range(8):
                    async with session.post(url + "/v1/chat/completions", json=text) as answer:
                        assert answer.status == 200
        assert len(users(d0)) == 8 and users(d1) == []
        # The KV canary's prompt is random words, so no prefix cache can stand in for the transfer.
        canaries = [b for b, h in zip(prefill.requests, prefill.headers, strict=True) if "canary" in request_id(h)]
        prompts = [b["messages"][0]["content"] for b in canaries]
        assert len(prompts) >= 2 and len(set(prompts)) == len(prompts) and len(prompts[0].split()) >= 32

    run(main)


def test_with_canaries_off_nothing_is_sent_and_health_says_so() -> None:
    async def main() -> None:
        e0, pd0 = StandIn("e0", role="encoder"), StandIn("pd0", unreachable_from={"e0"})
        async with running(e0, pd0):
            options = ProxyOptions(timeouts=FAST.timeouts, limits=FAST.limits, canary=Canary(interval_s=0))
            app = ProxyApp(roster_of({Role.ENCODER: [e0], Role.PD: [pd0]}), options)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                await asyncio.sleep(0.5)
                async with session.get(url + "/health") as answer:
                    health = await answer.json()
        assert health["canaries"] == "off" and health["transfers"] == []
        assert e0.requests == [] and pd0.requests == []

    run(main)


def test_a_pair_whose_instance_leaves_is_forgotten_and_a_new_one_is_checked_at_once() -> None:
    async def main() -> None:
        e0, pd0, pd1 = StandIn("e0", role="encoder"), StandIn("pd0"), StandIn("pd1")
        async with running(e0, pd0, pd1):
            roster = roster_of({Role.ENCODER: [e0], Role.PD: [pd0]})
            app = ProxyApp(roster, OPTIONS)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                await until(session, url, {(e0.url, pd0.url): "ok"})
                roster.replace(Role.PD, [InstanceSpec(pd1.url, name="pd1-pod")], healthy=True)
                report = await until(session, url, {(e0.url, pd1.url): "ok"})
                assert set(report) == {(e0.url, pd1.url)} and report[e0.url, pd1.url]["to_pod"] == "pd1-pod"

    run(main)


def test_the_operator_reads_the_failing_pair_from_the_proxys_health_even_while_it_answers_503() -> None:
    """The operator's reading (transfer_watch.read_proxy, then TransferReady's verdict) of this real proxy."""

    async def main() -> None:
        e0, e1 = StandIn("e0", role="encoder"), StandIn("e1", role="encoder")
        p0, d0 = StandIn("p0", unreachable_from={"e1"}), StandIn("d0")
        async with running(e0, e1, p0, d0):
            app = ProxyApp(roster_of({Role.ENCODER: [e0, e1], Role.PREFILL: [p0], Role.DECODE: [d0]}), OPTIONS)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                pairs = {(e1.url, p0.url): "failing", (e0.url, p0.url): "ok", (p0.url, d0.url): "ok"}
                await until(session, url, pairs)
                report = await read_proxy(url + "/health")
                d0.health = 503  # the only decode fails its probes: /health answers 503, with the report
                while (await session.get(url + "/health")).status != 503:
                    await asyncio.sleep(0.05)
                unready = await read_proxy(url + "/health")
        assert (report.pairs, report.proven, [(f.sender, f.receiver) for f in report.failing]) == (
            3,
            2,
            [(e1.url, p0.url)],
        )
        state, reason, message = verdict(report)
        assert (state, reason) == ("False", "TransferFailing") and f"ec {e1.url} -> {p0.url}" in message
        assert unready.reachable and unready.failing == report.failing

    run(main)


def test_a_decode_that_never_answers_fails_its_kv_pair_and_is_not_blamed_on_the_encoders() -> None:
    """An EC canary into a prefill runs on to a decode; each stage has the canary's limit, so the decode's
    timeout is the KV pair's failure and says nothing about the encoder's push."""

    async def main() -> None:
        e0, p0, d0 = StandIn("e0", role="encoder"), StandIn("p0"), StandIn("d0", delay_s=CANARY.timeout_s * 2)
        async with running(e0, p0, d0):
            app = ProxyApp(roster_of({Role.ENCODER: [e0], Role.PREFILL: [p0], Role.DECODE: [d0]}), OPTIONS)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                report = await until(session, url, {(p0.url, d0.url): "failing"})
        assert report[e0.url, p0.url]["state"] != "failing", report[e0.url, p0.url]
        assert report[p0.url, d0.url]["error"].startswith(f"decode {d0.url} sent nothing for {CANARY.timeout_s} s")

    run(main)
