"""Finding media parts, naming them by content, and refusing malformed requests (epd_connectors.proxy.media)."""

from __future__ import annotations

from typing import Any

import pytest

from epd_connectors.config.media import MediaAccess
from epd_connectors.proxy.errors import BadRequestError
from epd_connectors.proxy.media import ANY_HOST, check_body, content_uuid, find_media

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
        image("data:image/png;base64,YQ=="),
        {"type": "input_audio", "input_audio": {"data": "AAA", "format": "wav"}},
        {"video_url": {"url": "http://v"}},  # type inferred from the key, as vLLM does
        {"type": "audio_url", "audio_url": {"url": "http://a"}},
    )
    items = find_media(body)
    assert [i.type for i in items] == ["image_url", "input_audio", "video_url", "audio_url"]
    assert [i.position for i in items] == [0, 1, 2, 3]
    assert [(i.message, i.part) for i in items] == [(1, 1), (1, 2), (1, 3), (1, 4)]


def test_uuid_depends_on_content_only() -> None:
    first = find_media(chat(image("data:image/png;base64,YQ==")))[0].uuid
    again = find_media({"messages": [{"role": "user", "content": [image("data:image/png;base64,YQ==")]}]})[0].uuid
    other = find_media(chat(image("data:image/png;base64,Yg==")))[0].uuid
    assert first == again == content_uuid("image_url", image("data:image/png;base64,YQ=="))
    assert first != other
    assert len(first) == 64


def test_a_client_uuid_is_kept() -> None:
    assert find_media(chat({**image("data:image/png;base64,YQ=="), "uuid": "mine"}))[0].uuid == "mine"


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


PNG = "data:image/png;base64,iVBORw0KGgo="
CLOSED = MediaAccess(domains=())
LISTED = MediaAccess(domains=("images.example.com",), local_path="/media")


@pytest.mark.parametrize(
    ("part", "access", "needle"),
    [
        ({"type": "image_url", "image_url": {"url": None}}, ANY_HOST, "image_url has no url"),
        ({"type": "image_url", "image_url": {"detail": "high"}}, ANY_HOST, "image_url has no url"),
        ({"type": "image_url", "image_url": 12345}, ANY_HOST, "image_url has no url"),
        (image("data:image/png,not-base64"), ANY_HOST, "is not 'data:<type>;base64,<payload>'"),
        (image("data:image/png;base64,@@@@"), ANY_HOST, "payload is not base64"),
        (image("data:image/png;base64"), ANY_HOST, "is not 'data:<type>;base64,<payload>'"),
        (image("ftp://images.example.com/cat.png"), ANY_HOST, "scheme 'ftp' is not loaded"),
        (image("file:///etc/passwd"), ANY_HOST, "reads no local media files"),
        (image("file:///etc/passwd"), LISTED, "is not a file under /media"),
        (image("file:///media/../etc/passwd"), LISTED, "is not a file under /media"),
        (image("file://localhost/media/cat.png"), LISTED, "is not a file under /media"),
        (image("https://images.example.com/cat.png"), CLOSED, "this deployment fetches no media URLs"),
        (image("http://10.0.0.1/latest/meta-data"), LISTED, "host '10.0.0.1' is not allowed"),
        (image("http:///cat.png"), LISTED, "names no host"),
        ({"type": "video_url", "video_url": {"url": "gopher://x"}}, ANY_HOST, "video_url url scheme 'gopher'"),
    ],
)
def test_a_media_url_vllm_would_refuse_or_the_deployment_does_not_fetch_is_refused_naming_the_part(
    part: dict[str, Any], access: MediaAccess, needle: str
) -> None:
    with pytest.raises(BadRequestError) as caught:
        find_media(chat({"type": "text", "text": "look"}, part), access)
    assert needle in caught.value.message
    assert caught.value.message.startswith("messages[1].content[1]: ")
    assert "Fix:" in caught.value.message and caught.value.status == 400


@pytest.mark.parametrize(
    ("url", "access"),
    [
        (PNG, CLOSED),
        ("DATA:image/png;base64,iVBORw0KGgo=", CLOSED),
        ("https://images.example.com/cat.png", LISTED),
        ("https://IMAGES.example.com:8443/cat.png", LISTED),
        ("https://anything.example.org/cat.png", ANY_HOST),
        ("file:///media/cats/cat.png", LISTED),
        ("file:///media/cat%20one.png", LISTED),
    ],
)
def test_a_media_url_the_deployment_allows_passes(url: str, access: MediaAccess) -> None:
    assert [i.type for i in find_media(chat(image(url)), access)] == ["image_url"]
    assert [i.type for i in find_media(chat({"type": "image_url", "image_url": url}), access)] == ["image_url"]
