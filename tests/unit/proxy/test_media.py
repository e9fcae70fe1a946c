"""Finding media parts, naming them by content, and refusing malformed requests (epd_connectors.proxy.media)."""

from __future__ import annotations

from typing import Any

import pytest

from epd_connectors.proxy.errors import BadRequestError
from epd_connectors.proxy.media import check_body, content_uuid, find_media

pytestmark = pytest.mark.unit


def chat(*parts: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": list(parts)}],
    }


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def test_every_media_kind_in_order_with_positions() -> None:
    body = chat(
        {"type": "text", "text": "look"},
        image("data:a"),
        {"type": "input_audio", "input_audio": {"data": "AAA", "format": "wav"}},
        {"video_url": {"url": "http://v"}},  # type inferred from the key, as vLLM does
        {"type": "audio_url", "audio_url": {"url": "http://a"}},
    )
    items = find_media(body)
    assert [i.type for i in items] == ["image_url", "input_audio", "video_url", "audio_url"]
    assert [i.position for i in items] == [0, 1, 2, 3]
    assert [(i.message, i.part) for i in items] == [(1, 1), (1, 2), (1, 3), (1, 4)]


def test_uuid_depends_on_content_only() -> None:
    first = find_media(chat(image("data:a")))[0].uuid
    again = find_media({"messages": [{"role": "user", "content": [image("data:a")]}]})[0].uuid
    other = find_media(chat(image("data:b")))[0].uuid
    assert first == again == content_uuid("image_url", image("data:a"))
    assert first != other
    assert len(first) == 64


def test_a_client_uuid_is_kept() -> None:
    assert find_media(chat({**image("data:a"), "uuid": "mine"}))[0].uuid == "mine"


def test_text_only_has_no_media() -> None:
    assert find_media(chat({"type": "text", "text": "hi"})) == []


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"model": "m"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": ["hi"]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": ["x"]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": ""}]}]}, "no image_url"),
    ],
)
def test_malformed_chat_is_refused_with_the_place(body: dict[str, Any], needle: str) -> None:
    with pytest.raises(BadRequestError) as caught:
        find_media(body)
    assert needle in caught.value.message
    assert "Fix:" in caught.value.message
    assert caught.value.status == 400


def test_metadata_only_embeds_from_a_client_are_refused() -> None:
    """Such a reference names a cache entry no encoder produced for it; vLLM's engine dies on it."""
    ref = {"type": "image_embeds", "image_embeds": {"image_grid_thw": [1, 4, 4]}, "uuid": "abc"}
    with pytest.raises(BadRequestError, match="reserved for the proxy"):
        find_media(chat(ref))
    assert find_media(chat({"type": "image_embeds", "image_embeds": "BASE64TENSOR"})) == []


@pytest.mark.parametrize(
    ("body", "chat_", "needle"),
    [
        ([1], True, "JSON object"),
        ({"model": "m"}, False, "prompt"),
        ({"prompt": "x", "max_tokens": 0}, False, "max_tokens"),
        ({"prompt": "x", "max_tokens": True}, False, "max_tokens"),
        ({"messages": [], "stream": "yes"}, True, "stream"),
    ],
)
def test_check_body(body: Any, chat_: bool, needle: str) -> None:
    with pytest.raises(BadRequestError, match=needle):
        check_body(body, chat=chat_)


def test_check_body_passes_good_requests() -> None:
    body = {"prompt": "x", "max_tokens": 4, "stream": True}
    assert check_body(body, chat=False) is body
