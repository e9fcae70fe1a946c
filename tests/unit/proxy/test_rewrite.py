"""Encoder batches and the consumer's body: media become references only where the encoder reported metadata."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from epd_connectors.proxy.errors import BackendUnavailableError
from epd_connectors.proxy.media import find_media
from epd_connectors.proxy.rewrite import (
    EncoderBatch,
    batches,
    consumer_body,
    encoder_body,
    parse_encoder_answer,
    with_uuids,
)

pytestmark = pytest.mark.unit


def image(tag: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(tag)}}


def data_url(tag: str) -> str:
    return "data:image/png;base64," + base64.b64encode(tag.encode()).decode()


def request(*urls: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": "what is this"}, *(image(u) for u in urls)]
    return {
        "model": "tiny",
        "mm_processor_kwargs": {"x": 1},
        "temperature": 0,
        "messages": [{"role": "user", "content": content}],
    }


def answer_for(batch: EncoderBatch, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    return {
        "ec_transfer_params": {
            item.uuid: {"modality": "image", "item_indices": [i], "metadata": {"image_grid_thw": [[1, 4, 4]]}}
            for i, item in enumerate(batch.items)
            if item.uuid not in skip
        }
    }


def test_batches_group_per_encoder_in_order_with_a_cap_and_each_uuid_once() -> None:
    items = find_media(request("a", "b", "c", "a", "d"))
    assignment = list(zip(items, ["e1", "e2", "e1", "e1", "e1"], strict=True))
    plan = batches(assignment, batch_max=2)
    assert [(b.encoder, [i.content["image_url"]["url"] for i in b.items]) for b in plan] == [
        ("e1", [data_url("a"), data_url("c")]),
        ("e2", [data_url("b")]),
        ("e1", [data_url("d")]),
    ]
    assert all(len(b.transfer_ids) == len(b.items) for b in plan)
    assert len({t for b in plan for t in b.transfer_ids}) == 4


def test_encoder_body_carries_uuids_processor_options_and_push_target() -> None:
    items = find_media(request("a", "b"))
    batch = batches([(i, "e1") for i in items], 8)[0]
    body = encoder_body(request("a", "b"), batch, "tcp://10.0.0.5:14579")
    assert body["model"] == "tiny" and body["mm_processor_kwargs"] == {"x": 1} and body["max_tokens"] == 1
    assert "temperature" not in body and body["stream"] is False
    assert [p["uuid"] for p in body["messages"][0]["content"]] == [i.uuid for i in items]
    assert body["ec_transfer_params"] == {
        "consumer_zmq": "tcp://10.0.0.5:14579",
        "ec_items": [{"transfer_id": t} for t in batch.transfer_ids],
    }
    assert "ec_transfer_params" not in encoder_body(request("a"), batch, None)


def test_answer_matched_by_item_indices_mm_hash_or_single_entry() -> None:
    items = find_media(request("a", "b"))
    batch = batches([(i, "e1") for i in items], 8)[0]
    by_index = parse_encoder_answer(
        {"ec_transfer_params": {"engine-key": {"item_indices": [1], "metadata": {"image_grid_thw": [[1, 2, 2]]}}}},
        batch,
        "e1",
    )
    assert list(by_index) == [items[1].uuid]
    assert by_index[items[1].uuid].mm_hash == "engine-key"
    assert by_index[items[1].uuid].metadata == {"image_grid_thw": [1, 2, 2]}
    by_hash = parse_encoder_answer({"ec_transfer_params": {items[0].uuid: {"metadata": {"g": [1]}}}}, batch, "e1")
    assert list(by_hash) == [items[0].uuid]
    single = batches([(items[0], "e1")], 8)[0]
    only = parse_encoder_answer({"ec_transfer_params": {"other": {"metadata": {"g": [1]}}}}, single, "e1")
    assert only[items[0].uuid].mm_hash == "other"
    assert parse_encoder_answer({"ec_transfer_params": None}, batch, "e1") == {}
    assert parse_encoder_answer([], batch, "e1") == {}


def test_an_index_outside_the_batch_is_the_encoders_fault() -> None:
    items = find_media(request("a"))
    batch = batches([(items[0], "e1")], 8)[0]
    with pytest.raises(BackendUnavailableError, match="outside its batch"):
        parse_encoder_answer({"ec_transfer_params": {"k": {"item_indices": [3], "metadata": {}}}}, batch, "e1")


def test_an_item_without_returned_metadata_keeps_its_kind_as_media() -> None:
    """An embeds reference the encoder never produced would crash vLLM's engine, and vLLM refuses raw media and
    references of one kind in one request: both images stay media (with the proxy's uuids), while a clip of the
    same request, whose metadata came back, is still a reference."""
    req = request("a", "b")
    req["messages"][0]["content"].append({"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}})
    items = find_media(req)
    batch = batches([(i, "e1") for i in items], 8)[0]
    answer = answer_for(batch, skip=frozenset({items[1].uuid}))
    answer["ec_transfer_params"][items[2].uuid]["metadata"] = {"audio_num_tokens": [25]}
    encoded = parse_encoder_answer(answer, batch, "e1")
    transfer = {i.uuid: t for i, t in zip(batch.items, batch.transfer_ids, strict=True)}
    body = consumer_body(req, items, encoded, transfer)
    parts = body["messages"][0]["content"]
    assert parts[0] == {"type": "text", "text": "what is this"}
    assert parts[1] == {**image("a"), "uuid": items[0].uuid}
    assert parts[2] == {**image("b"), "uuid": items[1].uuid}
    assert parts[3] == {"type": "audio_embeds", "audio_embeds": {"audio_num_tokens": [25]}, "uuid": items[2].uuid}
    ec = body["ec_transfer_params"]
    assert ec["ec_items"] == [
        {"mm_hash": items[0].uuid, "transfer_id": batch.transfer_ids[0]},
        {"transfer_id": batch.transfer_ids[1]},
        {"mm_hash": items[2].uuid, "transfer_id": batch.transfer_ids[2]},
    ]
    assert ec[items[0].uuid]["metadata"] == {"image_grid_thw": [[1, 4, 4]]}
    assert req["messages"][0]["content"][1] == image("a"), "the client's request is not modified"
    every = parse_encoder_answer(answer_for(batch), batch, "e1")
    assert consumer_body(req, items, every, transfer)["messages"][0]["content"][2]["type"] == "image_embeds"


def test_without_a_push_connector_there_are_no_ec_items() -> None:
    req = request("a")
    items = find_media(req)
    batch = batches([(items[0], "e1")], 8)[0]
    body = consumer_body(req, items, parse_encoder_answer(answer_for(batch), batch, "e1"), {})
    assert "ec_items" not in body["ec_transfer_params"]
    assert consumer_body(request(), [], {}, {}) == request()


def test_audio_and_video_become_their_embeds_kind() -> None:
    req = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "input_audio", "input_audio": {"data": "AAA", "format": "wav"}},
                    {"type": "video_url", "video_url": {"url": data_url("v")}},
                ],
            }
        ]
    }
    items = find_media(req)
    batch = batches([(i, "e1") for i in items], 8)[0]
    body = consumer_body(req, items, parse_encoder_answer(answer_for(batch), batch, "e1"), {})
    assert [p["type"] for p in body["messages"][0]["content"]] == ["audio_embeds", "video_embeds"]


def test_decode_after_prefill_gets_media_with_uuids_and_no_ec_params() -> None:
    req = {**request("a"), "ec_transfer_params": {"x": 1}}
    items = find_media(req)
    body = with_uuids(req, items)
    assert body["messages"][0]["content"][1] == {**image("a"), "uuid": items[0].uuid}
    assert "ec_transfer_params" not in body
