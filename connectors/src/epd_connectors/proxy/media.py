"""Finding the media items of a chat request and naming each by its content.

The encoders, the consumer and the proxy must agree on one key per media item: the proxy sends each item to
its encoder with a `uuid` (vLLM uses it as the item's cache key), and later refers to the encoded item by that
uuid alone. The uuid hashes the content, so a repeated image gets the same key and meets the encoder that
already holds it. Everything here is pure and checks the request shape, so a malformed request is refused
with a message instead of reaching vLLM: a media part without a URL, a data URL that does not decode, and a URL
the deployment does not fetch (its MediaAccess: the hosts and directory vLLM is told to allow) are refused here,
before any backend sees them, as vLLM would refuse them (or fetch what it should not) further on.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from epd_connectors.config.media import MediaAccess
from epd_connectors.proxy.errors import BadRequestError

MEDIA_TYPES: dict[str, str] = {
    "image_url": "image_embeds",
    "image_pil": "image_embeds",
    "audio_url": "audio_embeds",
    "input_audio": "audio_embeds",
    "video_url": "video_embeds",
}
"""Media part types vLLM 0.33 accepts in chat content, and the `*_embeds` type each becomes once encoded."""

EMBEDS_TYPES = frozenset(MEDIA_TYPES.values())
URL_TYPES = frozenset({"image_url", "audio_url", "video_url"})
"""Media parts that name their content by URL ({"url": ...}, or the URL alone as vLLM also accepts)."""
ANY_HOST = MediaAccess()
FETCHED_SCHEMES = ("http:", "https:", "file:")
"""URL schemes whose content the encoder has to fetch (vLLM's MediaConnector); a data URL is inline."""
_INFER_ORDER = ("image_url", "image_pil", "image_embeds", "audio_url", "input_audio", "audio_embeds", "video_url")


@dataclass(frozen=True)
class MediaItem:
    """One media part of a request, where it is and what it is called."""

    position: int
    """Order among the request's media parts (vLLM's `mm_features` order)."""
    message: int
    part: int
    type: str
    uuid: str
    content: Mapping[str, Any]
    """The part as the client sent it."""

    @property
    def where(self) -> str:
        return f"messages[{self.message}].content[{self.part}]"


def fetched_url(item: MediaItem) -> str | None:
    """The URL an encoder has to fetch for this item (http, https, file), or None when the content is inline."""
    value = item.content.get(item.type)
    url = value.get("url") if isinstance(value, Mapping) else value
    return url if isinstance(url, str) and url.lower().startswith(FETCHED_SCHEMES) else None


def part_type(part: Mapping[str, Any]) -> str | None:
    """The part's type, inferred from its keys when `type` is absent (as vLLM does)."""
    explicit = part.get("type")
    if isinstance(explicit, str):
        return explicit
    for key in _INFER_ORDER:
        if key in part:
            return key
    return "text" if "text" in part else None


def content_uuid(media_type: str, part: Mapping[str, Any]) -> str:
    """A key for the item's content: the same bytes or URL give the same key in every request."""
    value = part.get(media_type)
    # {"url": ...} for *_url, {"data": ..., "format": ...} for input_audio; every key counts, since one such as
    # `detail` may change preprocessing.
    payload = "\x1f".join(f"{k}={value[k]}" for k in sorted(value)) if isinstance(value, Mapping) else str(value)
    return hashlib.sha256(f"{media_type}\x1e{payload}".encode()).hexdigest()


def _problem(where: str, what: str, fix: str) -> BadRequestError:
    return BadRequestError(f"{where}: {what}. Fix: {fix}")


def find_media(body: Mapping[str, Any], access: MediaAccess = ANY_HOST) -> list[MediaItem]:
    """Every media part of a chat request in order; BadRequestError naming the first malformed part or the
    first URL `access` does not allow."""
    messages = body.get("messages")
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes) or not messages:
        raise _problem("messages", "missing, empty or not a list", "send a non-empty list of chat messages")
    items: list[MediaItem] = []
    for m, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise _problem(f"messages[{m}]", "is not an object", "send {role, content} objects")
        content = message.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, Sequence):
            raise _problem(f"messages[{m}].content", "is neither a string nor a list", "send text or parts")
        for p, part in enumerate(content):
            where = f"messages[{m}].content[{p}]"
            if not isinstance(part, Mapping):
                raise _problem(where, "is not an object", 'send {"type": ..., ...} parts')
            kind = part_type(part)
            if kind in EMBEDS_TYPES:
                _check_client_embeds(where, kind, part)
                continue
            if kind not in MEDIA_TYPES:
                continue
            if part.get(kind) in (None, "", {}):
                raise _problem(where, f"{kind} part has no {kind} value", f"give the {kind} content")
            if kind in URL_TYPES:
                _check_url(where, kind, part[kind], access)
            given = part.get("uuid")
            uuid = given if isinstance(given, str) and given else content_uuid(kind, part)
            items.append(MediaItem(len(items), m, p, kind, uuid, part))
    return items


def _check_url(where: str, kind: str, value: Any, access: MediaAccess) -> None:
    """The part's URL is one vLLM loads and this deployment allows (vLLM 0.32-0.34: data, http(s), file)."""
    url = value.get("url") if isinstance(value, Mapping) else value
    if not isinstance(url, str) or not url:
        raise _problem(
            where, f"{kind} has no url", f'send {{"{kind}": {{"url": "data:...;base64,..." or "https://..."}}}}'
        )
    scheme = url.partition(":")[0].lower()
    if scheme == "data":
        _check_data_url(where, kind, url)
    elif scheme in ("http", "https"):
        host = urlsplit(url).hostname
        if not host:
            raise _problem(where, f"{kind} url {_short(url)} names no host", "send a whole http(s) URL")
        if access.domains == ():
            raise _problem(
                where,
                f"{kind} url {_short(url)}: this deployment fetches no media URLs",
                "send the media inline as a base64 data URL, or allow the host in spec.media.allowedDomains",
            )
        if not access.allows_host(host):
            raise _problem(where, f"{kind} url host {host!r} is not allowed", "allow it in spec.media.allowedDomains")
    elif scheme == "file":
        split = urlsplit(url)
        if access.local_path is None:
            raise _problem(
                where,
                f"{kind} url {_short(url)}: this deployment reads no local media files",
                "send the media inline, or set spec.media.allowedLocalMediaPath",
            )
        if split.netloc or not access.allows_file(unquote(split.path)):
            raise _problem(
                where, f"{kind} url {_short(url)} is not a file under {access.local_path}", "use file:///<that dir>/..."
            )
    else:
        raise _problem(where, f"{kind} url scheme {scheme!r} is not loaded", "use a data, http or https URL")


def _check_data_url(where: str, kind: str, url: str) -> None:
    """As vLLM's MediaConnector reads it: 'data:<type>;base64,<payload>', the payload valid base64."""
    header, comma, payload = url[len("data:") :].partition(",")
    if not comma or not header.endswith(";base64"):
        raise _problem(where, f"{kind} data URL is not 'data:<type>;base64,<payload>'", "base64-encode the media")
    try:
        base64.b64decode(payload, validate=True)
    except binascii.Error as exc:
        raise _problem(where, f"{kind} data URL's payload is not base64 ({exc})", "base64-encode the media") from None


def _short(url: str) -> str:
    return repr(url if len(url) <= 80 else url[:77] + "...")


def _check_client_embeds(where: str, kind: str, part: Mapping[str, Any]) -> None:
    """A client's own embeddings must carry tensor data: a metadata-only reference names a cache entry the
    encoders never produced, and vLLM's engine dies on it (facts.md)."""
    value = part.get(kind)
    if isinstance(value, str) and value:
        return
    if isinstance(value, Mapping) and value and all(isinstance(v, str) for v in value.values()):
        return
    raise _problem(
        where,
        f"{kind} without tensor data (a metadata-only reference) is reserved for the proxy",
        f"send the media as {kind.replace('_embeds', '_url')}, or base64 tensors in {kind}",
    )


def check_body(body: Any, *, chat: bool) -> dict[str, Any]:
    """The request object, or BadRequestError for the shapes vLLM would refuse or crash on."""
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    if not chat and "prompt" not in body:
        raise _problem("prompt", "missing", "send a prompt (string or list)")
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise _problem(key, f"{value!r} is not a positive integer", "send a positive integer or omit it")
    if not isinstance(body.get("stream", False), bool):
        raise _problem("stream", "is not a boolean", "send true or false")
    return body
