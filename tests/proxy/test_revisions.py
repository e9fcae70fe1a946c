"""Revision-consistent routing: with the model pods' revisions known (discovery's pod watch fills
Roster.revisions), a request's encoder, prefill and decode are all of one revision, the newest whole set takes
new requests, a request with no whole set waits for one, a request whose set is retired under it runs again on
the set that took over, and canaries pair only instances of one revision.

The backends are the tier's stand-ins (they record what reached them); real vLLM of two revisions on real pods
is tests/e2e/pods/test_e_p_d.py."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from epd_connectors.config.roles import Role
from epd_connectors.proxy import flow
from epd_connectors.proxy.app import ProxyApp
from epd_connectors.proxy.canary import pairs_of
from epd_connectors.proxy.roster import InstanceSpec, PodRevision, Roster
from tests.proxy.harness import FAST, data_url, post_json, run, serving
from tests.proxy.stand_ins import StandIn, running

OLD, NEW = PodRevision("aaaa", "2026-12-03T01:00:00Z"), PodRevision("bbbb", "2026-12-03T02:00:00Z")


def chat(seed: int) -> dict[str, Any]:
    content = [{"type": "text", "text": "what"}, {"type": "image_url", "image_url": {"url": data_url(f"img{seed}")}}]
    return {"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": content}]}


def two_sets() -> dict[str, StandIn]:
    return {
        f"{role}-{rev}": StandIn(f"{role}-{rev}", role=role)
        for role in ("encoder", "prefill", "decode")
        for rev in ("old", "new")
    }


def roster_for(stand_ins: dict[str, StandIn], present: list[str]) -> Roster:
    roles = {"encoder": Role.ENCODER, "prefill": Role.PREFILL, "decode": Role.DECODE}
    specs: dict[Role, list[InstanceSpec]] = {role: [] for role in roles.values()}
    for name in present:
        specs[roles[name.split("-")[0]]].append(InstanceSpec(stand_ins[name].url, name=name))
    roster = Roster.build(specs, healthy=True)
    roster.set_revisions({name: OLD if name.endswith("old") else NEW for name in stand_ins})
    return roster


def served(stand_ins: dict[str, StandIn]) -> set[str]:
    return {name for name, s in stand_ins.items() if s.requests}


def test_every_request_stays_within_the_newest_whole_revision_and_falls_back_to_the_old_one_whole() -> None:
    async def main() -> None:
        stand_ins = two_sets()
        async with running(*stand_ins.values()):
            roster = roster_for(stand_ins, list(stand_ins))
            async with serving(ProxyApp(roster, FAST)) as url, aiohttp.ClientSession() as session:
                for seed in range(6):
                    status, _ = await post_json(session, url + "/v1/chat/completions", chat(seed))
                    assert status == 200
                assert served(stand_ins) == {"encoder-new", "prefill-new", "decode-new"}
                async with session.get(url + "/health") as response:
                    assert (await response.json())["modelRevision"] == NEW.revision
                # The new set loses its only prefill: the old set is the only whole one, and takes everything.
                # The stand-in answers /health 503 too, or the 0.2 s prober would mark it healthy again mid-test.
                stand_ins["prefill-new"].health = 503
                roster.get(Role.PREFILL, stand_ins["prefill-new"].url).healthy = False  # type: ignore[union-attr]
                for stand_in in stand_ins.values():
                    stand_in.requests.clear()
                for seed in range(6, 12):
                    status, _ = await post_json(session, url + "/v1/chat/completions", chat(seed))
                    assert status == 200
                assert served(stand_ins) == {"encoder-old", "prefill-old", "decode-old"}

    run(main)


def test_a_request_with_no_whole_revision_waits_for_one_and_never_mixes() -> None:
    async def main() -> None:
        stand_ins = two_sets()
        async with running(*stand_ins.values()):
            # Mid-switch: the old encoder went, the new prefill is not seen yet.
            roster = roster_for(stand_ins, ["encoder-new", "prefill-old", "decode-old", "decode-new"])
            async with serving(ProxyApp(roster, FAST)) as url, aiohttp.ClientSession() as session:
                answer = asyncio.ensure_future(session.post(url + "/v1/chat/completions", json=chat(1)))
                await asyncio.sleep(0.5)
                assert not answer.done() and not served(stand_ins), "nothing is sent while no revision is whole"
                roster.replace(
                    Role.PREFILL,
                    [InstanceSpec(stand_ins[n].url, name=n) for n in ("prefill-old", "prefill-new")],
                    healthy=True,
                )
                async with await answer as response:
                    assert response.status == 200
                assert served(stand_ins) == {"encoder-new", "prefill-new", "decode-new"}

    run(main)


def test_a_request_that_finds_no_whole_revision_in_time_is_refused_naming_the_revisions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(flow, "REVISION_WAIT_S", 0.3)

    async def main() -> None:
        stand_ins = two_sets()
        async with running(*stand_ins.values()):
            roster = roster_for(stand_ins, ["encoder-new", "prefill-old", "decode-old"])
            async with serving(ProxyApp(roster, FAST)) as url, aiohttp.ClientSession() as session:
                status, body = await post_json(session, url + "/v1/chat/completions", chat(1))
        assert status == 503
        message = body["error"]["message"]
        assert "no model revision has a healthy instance of every role" in message
        assert "encoder bbbb" in message and "prefill aaaa" in message, message
        assert not served(stand_ins)

    run(main)


@pytest.mark.parametrize("failure", ["answers 500", "refuses connections"])
def test_a_request_whose_set_is_retired_under_it_runs_again_on_the_set_that_took_over(failure: str) -> None:
    """A roll (issue 33): the new set turns Ready and the old pods get SIGTERM at once, while the proxy may not
    have seen the new set whole yet. The old decode fails the request on it (vLLM aborts what it was doing, or
    has stopped listening) before any byte reached the client: the request waits for the new set and is
    answered by that set alone, not 502."""

    async def main() -> None:
        stand_ins = two_sets()
        async with running(*stand_ins.values()):
            # The new prefill is Ready, but its Service's watch has not shown it yet: the old set is the whole one.
            roster = roster_for(stand_ins, [n for n in stand_ins if n != "prefill-new"])
            async with serving(ProxyApp(roster, FAST)) as url, aiohttp.ClientSession() as session:
                if failure == "answers 500":
                    stand_ins["decode-old"].statuses = [500]
                else:
                    await stand_ins["decode-old"].stop()
                answer = asyncio.ensure_future(post_json(session, url + "/v1/chat/completions", chat(1)))
                await asyncio.sleep(0.5)
                assert not answer.done(), "the request waits for the set that takes over"
                roster.replace(
                    Role.PREFILL,
                    [InstanceSpec(stand_ins[n].url, name=n) for n in ("prefill-old", "prefill-new")],
                    healthy=True,
                )
                status, body = await answer
        assert status == 200, body
        assert body["choices"][0]["message"]["content"] == "from decode-new"
        assert {"encoder-new", "prefill-new", "decode-new"} <= served(stand_ins)
        assert len(stand_ins["decode-new"].requests) == 1

    run(main)


def test_a_failing_canary_of_the_new_sets_only_pair_steers_nothing_to_the_old_set_and_refuses_nothing() -> None:
    """A roll's new set answers its first canaries late (its pods are cold, the old set still loaded), so its
    only encoder -> prefill pair may be marked failing. "Never refuse a request that has no other way" counts
    the instances of the request's revision only: the old set's healthy encoder is no way for a request on the
    new set. Counted over every revision, the new encoder was avoided for its failing canary and the old one for
    its revision, and media requests were answered 503 "no healthy encoder" (issue 33, a cold make test)."""

    async def main() -> None:
        stand_ins = two_sets()
        async with running(*stand_ins.values()):
            roster = roster_for(stand_ins, list(stand_ins))
            roster.failing = frozenset({(stand_ins["encoder-new"].url, stand_ins["prefill-new"].url)})
            async with serving(ProxyApp(roster, FAST)) as url, aiohttp.ClientSession() as session:
                for seed in range(4):
                    status, body = await post_json(session, url + "/v1/chat/completions", chat(seed))
                    assert status == 200, body
        assert served(stand_ins) == {"encoder-new", "prefill-new", "decode-new"}

    run(main)


def test_a_failure_of_the_newest_set_is_answered_at_once_and_never_moves_to_an_older_set() -> None:
    async def main() -> None:
        stand_ins = two_sets()
        stand_ins["decode-new"].statuses = [500]
        async with running(*stand_ins.values()):
            roster = roster_for(stand_ins, list(stand_ins))
            async with serving(ProxyApp(roster, FAST)) as url, aiohttp.ClientSession() as session:
                started = asyncio.get_running_loop().time()
                status, body = await post_json(session, url + "/v1/chat/completions", chat(1))
                took = asyncio.get_running_loop().time() - started
        assert status == 502, body
        assert "decode-new says 500" in body["error"]["message"]
        assert took < flow.REVISION_WAIT_S / 2, took
        assert served(stand_ins) == {"encoder-new", "prefill-new", "decode-new"}

    run(main)


def test_canaries_pair_only_instances_of_one_revision() -> None:
    names = [f"{role}-{rev}" for role in ("encoder", "prefill", "decode") for rev in ("old", "new")]
    stand_ins = {n: StandIn(n, url=f"http://{n}:8000") for n in names}
    pairs = {
        (p.sender.split("//")[1][:-5], p.receiver.split("//")[1][:-5]) for p in pairs_of(roster_for(stand_ins, names))
    }
    assert pairs == {
        ("encoder-old", "prefill-old"),
        ("encoder-new", "prefill-new"),
        ("prefill-old", "decode-old"),
        ("prefill-new", "decode-new"),
    }
