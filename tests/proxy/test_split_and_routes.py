"""Prefill/decode split (MooncakeConnector and content-keyed KV hand-over), /v1/completions, /v1/models,
/metrics stage histograms."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import aiohttp

from epd_connectors.config.bundle import KVProtocol
from epd_connectors.config.roles import Role
from epd_connectors.proxy.app import ProxyApp
from epd_connectors.proxy.media import find_media
from epd_connectors.proxy.roster import InstanceSpec
from tests.proxy.harness import FAST, data_url, post_json, roster_of, run, serving
from tests.proxy.stand_ins import StandIn, running

MOONCAKE = replace(FAST, timeouts=FAST.timeouts, limits=FAST.limits, kv_protocol=KVProtocol.MOONCAKE)


def chat(stream: bool = False) -> dict[str, Any]:
    content = [{"type": "text", "text": "what"}, {"type": "image_url", "image_url": {"url": data_url("img")}}]
    return {"model": "tiny", "stream": stream, "max_tokens": 20, "messages": [{"role": "user", "content": content}]}


def test_e_p_d_with_mooncake_connector_names_both_sides_with_one_transfer() -> None:
    """Stand-in prefill (with a bootstrap /query) and decode: they record the params vLLM would act on."""

    async def main() -> None:
        enc, prefill, decode = StandIn("e0", role="encoder"), StandIn("p0"), StandIn("d0")
        async with running(enc, prefill, decode):
            spec = InstanceSpec(prefill.url, ("tcp://127.0.0.1:14579",), bootstrap_url=prefill.url)
            roster = roster_of({Role.ENCODER: [enc], Role.PREFILL: [spec], Role.DECODE: [decode]})
            app = ProxyApp(roster, MOONCAKE)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                for stream in (False, True):
                    async with session.post(url + "/v1/chat/completions", json=chat(stream)) as r:
                        assert r.status == 200 and "d0" in await r.text()
                metrics = await (await session.get(url + "/metrics")).text()
        uuid = find_media(chat())[0].uuid
        p, d = prefill.requests[0], decode.requests[0]
        assert p["max_tokens"] == 1 and p["stream"] is False
        assert p["messages"][0]["content"][1] == {
            "type": "image_embeds",
            "image_embeds": {"image_grid_thw": [1, 4, 4]},
            "uuid": uuid,
        }
        assert (
            p["ec_transfer_params"]["ec_items"][0]["transfer_id"]
            == enc.requests[0]["ec_transfer_params"]["ec_items"][0]["transfer_id"]
        )
        transfer = p["kv_transfer_params"]["transfer_id"]
        assert p["kv_transfer_params"] == {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "transfer_id": transfer,
        }
        assert d["kv_transfer_params"] == {
            "do_remote_decode": False,
            "do_remote_prefill": True,
            "remote_bootstrap_addr": prefill.url,
            "remote_engine_id": "engine-p0",
            "transfer_id": transfer,
        }
        assert d["max_tokens"] == 20 and "ec_transfer_params" not in d
        assert d["messages"][0]["content"][1] == {
            "type": "image_url",
            "image_url": {"url": data_url("img")},
            "uuid": uuid,
        }
        assert decode.requests[1]["stream"] is True
        for stage in ("encode", "prefill", "first_token", "total"):
            assert f'epd_proxy_stage_seconds_count{{stage="{stage}"}}' in metrics

    run(main)


def test_passive_kv_decode_follows_the_prefill_and_a_failed_decode_moves_on() -> None:
    """Stand-in decodes, one answering 503 once: the decode retry does not redo the prefill."""

    async def main() -> None:
        prefill, decodes = StandIn("p0"), [StandIn("d0", statuses=[503]), StandIn("d1")]
        async with running(prefill, *decodes):
            roster = roster_of({Role.PREFILL: [prefill], Role.DECODE: decodes})
            app = ProxyApp(roster, FAST)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                answers = [await post_json(session, url + "/v1/completions", {"prompt": "hi"}) for _ in range(2)]
        assert [status for status, _ in answers] == [200, 200]
        assert decodes[0].statuses == [], "d0 failed once and its request went on to d1"
        assert len(prefill.requests) == 2, "a decode retry does not redo the prefill"
        assert prefill.requests[0]["max_tokens"] == 1 and "kv_transfer_params" not in prefill.requests[0]
        assert sum(len(d.requests) for d in decodes) == 3

    run(main)


def test_prefill_down_gives_a_clear_5xx() -> None:
    """Stand-in prefill that answers 500 every time: the client gets 502 naming the prefill."""

    async def main() -> None:
        prefill, decode = StandIn("p0", statuses=[500] * 5), StandIn("d0")
        async with running(prefill, decode):
            app = ProxyApp(roster_of({Role.PREFILL: [prefill], Role.DECODE: [decode]}), FAST)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                status, body = await post_json(session, url + "/v1/completions", {"prompt": "hi"})
        assert status == 502 and "prefill" in body["error"]["message"]
        assert decode.requests == []

    run(main)


def test_models_and_unknown_routes() -> None:
    """Stand-in PD answering /v1/models."""

    async def main() -> None:
        pd = StandIn("pd0")
        async with running(pd):
            app = ProxyApp(roster_of({Role.PD: [pd]}), FAST)
            async with serving(app) as url, aiohttp.ClientSession() as session:
                async with session.get(url + "/v1/models") as r:
                    models = await r.json()
                async with session.get(url + "/nope") as r:
                    missing = r.status
                async with session.get(url + "/v1/chat/completions") as r:
                    wrong_method = r.status
        assert models["data"][0]["id"] == "tiny"
        assert missing == 404 and wrong_method == 405

    run(main)
