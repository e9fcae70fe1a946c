"""Media an encoder cannot load: the client gets a 4xx naming the item, the consumer never sees the request, and
the encoders are asked a bounded number of times.

Stand-in encoders (not vLLM) told which status to answer: a real vLLM encoder answers 400 for bytes that are not
an image or an unsupported scheme, and 500 for a URL whose host refuses the connection or a file URL it may not
read (tests/e2e/ec_example/test_proxy_faults.py sends those to real vLLM).
"""

from __future__ import annotations

import socket
from dataclasses import replace
from typing import Any

import aiohttp

from epd_connectors.config.media import MediaAccess
from epd_connectors.config.roles import Role
from epd_connectors.proxy.app import ProxyApp
from epd_connectors.proxy.settings import ProxyOptions
from tests.proxy.harness import FAST, post_json, roster_of, run
from tests.proxy.harness import serving as serving_app
from tests.proxy.stand_ins import StandIn, running


def chat(url: str) -> dict[str, Any]:
    content = [{"type": "text", "text": "describe"}, {"type": "image_url", "image_url": {"url": url}}]
    return {"model": "tiny", "messages": [{"role": "user", "content": content}]}


def nothing_listens() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def ask(
    encoders: list[Any], body: dict[str, Any], options: ProxyOptions = FAST
) -> tuple[int, dict[str, Any], StandIn]:
    """One request through a proxy in front of these encoders (stand-ins or URLs) and a stand-in PD."""
    pd = StandIn("pd0")
    stand_ins = [e for e in encoders if isinstance(e, StandIn)]
    async with running(*stand_ins, pd):
        app = ProxyApp(roster_of({Role.ENCODER: encoders, Role.PD: [pd]}), options, probe=False)
        async with serving_app(app) as url, aiohttp.ClientSession() as session:
            status, answer = await post_json(session, url + "/v1/chat/completions", body)
    return status, answer, pd


def test_a_url_every_encoder_answered_500_for_is_a_422_naming_the_item_after_one_try_each() -> None:
    image = nothing_listens() + "/cat.png"

    async def main() -> None:
        encoders = [StandIn(f"e{i}", role="encoder", statuses=[500, 500]) for i in range(2)]
        status, answer, pd = await ask(encoders, chat(image))
        message = answer["error"]["message"]
        assert status == 422, answer
        assert answer["error"]["type"] == "invalid_request_error"
        assert "messages[0].content[1]" in message and image in message and "says 500" in message
        assert "Fix:" in message
        assert [len(e.requests) for e in encoders] == [1, 1]  # each encoder once: no retry storm
        assert pd.requests == []

    run(main)


def test_a_file_url_the_only_encoder_answered_500_for_is_a_422() -> None:
    async def main() -> None:
        encoder = StandIn("e0", role="encoder", statuses=[500])
        local = replace(FAST, media=MediaAccess(local_path="/srv/images"))
        status, answer, pd = await ask([encoder], chat("file:///srv/images/cat.png"), local)
        assert status == 422 and "file:///srv/images/cat.png" in answer["error"]["message"], answer
        assert len(encoder.requests) == 1 and pd.requests == []

    run(main)


def test_inline_media_the_encoders_answered_500_for_stays_the_encoders_fault() -> None:
    """A data URL needs no fetch: a 5xx for it says the encoders are broken, so 502 (retryable by the client)."""

    async def main() -> None:
        encoders = [StandIn(f"e{i}", role="encoder", statuses=[500]) for i in range(2)]
        status, answer, pd = await ask(encoders, chat("data:image/png;base64,AAAA"))
        assert status == 502 and "says 500" in answer["error"]["message"], answer
        assert pd.requests == []

    run(main)


def test_an_encoder_s_400_for_the_media_is_passed_on_once() -> None:
    """vLLM answers 400 for bytes that are not an image: passed through as it is, not retried elsewhere."""

    async def main() -> None:
        encoders = [StandIn(f"e{i}", role="encoder", statuses=[400]) for i in range(2)]
        status, answer, pd = await ask(encoders, chat("data:image/png;base64,bm90IGFuIGltYWdl"))
        assert status == 400 and answer["error"]["message"].endswith("says 400"), answer
        assert sum(len(e.requests) for e in encoders) == 1 and pd.requests == []

    run(main)


def test_a_url_whose_encoder_cannot_be_reached_is_not_blamed_on_the_url() -> None:
    async def main() -> None:
        status, answer, pd = await ask([nothing_listens()], chat("http://127.0.0.1:9/cat.png"))
        assert status == 502 and "unreachable" in answer["error"]["message"], answer
        assert pd.requests == []

    run(main)
