"""The request bodies the proxy sends: encoder batches, and the consumer's body with media made references.

After an encoder has produced an item's embedding, the consumer needs only a reference to it: the item becomes
`{"type": "<kind>_embeds", "<kind>_embeds": <metadata>, "uuid": <uuid>}`, where the metadata (such as
`image_grid_thw`) is what the encoder reported for that item. An item is rewritten only when its encoder
reported metadata for it: a reference whose uuid the encoder never produced crashes vLLM's engine, so an item
without metadata stays the original media (with its uuid, so both sides key it alike). vLLM refuses a request
that mixes raw media and references of one kind ("Mixing raw audio and embedding inputs is not allowed"), so
then every item of that kind stays media. Pure functions only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from epd_connectors.proxy.errors import BackendUnavailableError
from epd_connectors.proxy.media import MEDIA_TYPES, MediaItem

FORWARDED_TO_ENCODER = ("model", "mm_processor_kwargs", "media_io_kwargs", "priority", "chat_template")
"""Request keys that change what an encoder computes (or which model it is), copied into encoder batches."""


@dataclass(frozen=True)
class Encoded:
    """What an encoder reported for one item."""

    mm_hash: str
    """The encoder engine's key for the item (the uuid, possibly folded with processor options)."""
    metadata: dict[str, Any]
    """Placeholder metadata (e.g. image_grid_thw), flattened per key; empty when none was reported."""
    reported: dict[str, Any]
    """The encoder's whole entry, passed on to the consumer under mm_hash (connector handles)."""


@dataclass
class EncoderBatch:
    """Items sent to one encoder in one request."""

    encoder: str
    items: list[MediaItem]
    transfer_ids: list[str] = field(default_factory=list)


def new_transfer_id() -> str:
    """A fresh id naming one push from an encoder to a consumer (or one KV hand-over)."""
    return os.urandom(16).hex()


def batches(assignment: Sequence[tuple[MediaItem, str]], batch_max: int) -> list[EncoderBatch]:
    """Items grouped by encoder in request order, at most `batch_max` per batch; a uuid appears once."""
    by_encoder: dict[str, list[EncoderBatch]] = {}
    seen: set[str] = set()
    out: list[EncoderBatch] = []
    for item, encoder in assignment:
        if item.uuid in seen:
            continue
        seen.add(item.uuid)
        groups = by_encoder.setdefault(encoder, [])
        if not groups or len(groups[-1].items) >= max(1, batch_max):
            groups.append(EncoderBatch(encoder, []))
            out.append(groups[-1])
        groups[-1].items.append(item)
        groups[-1].transfer_ids.append(new_transfer_id())
    return out


def encoder_body(request: Mapping[str, Any], batch: EncoderBatch, consumer_zmq: str | None) -> dict[str, Any]:
    """The encoder request for a batch: only its media (with uuids), one output token, no stream.

    With a push connector (ECMooncakeConnector) the encoder must know where to push (`consumer_zmq`) and under
    which transfer id per item, matched by position; without consumer_zmq it answers 200 and never pushes.
    """
    content = [{**item.content, "uuid": item.uuid} for item in batch.items]
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 1,
        "stream": False,
    }
    for key in FORWARDED_TO_ENCODER:
        if key in request:
            body[key] = request[key]
    if consumer_zmq is not None:
        body["ec_transfer_params"] = {
            "consumer_zmq": consumer_zmq,
            "ec_items": [{"transfer_id": t} for t in batch.transfer_ids],
        }
    return body


def _flatten(value: Any) -> Any:
    """Per-item metadata as vLLM's embeds parser reads it: one flat list per key ([[1, 4, 4]] -> [1, 4, 4])."""
    if not isinstance(value, list):
        return value
    flat: list[Any] = []
    for element in value:
        flat.extend(element if isinstance(element, list) else [element])
    return flat


def parse_encoder_answer(answer: Any, batch: EncoderBatch, encoder: str) -> dict[str, Encoded]:
    """Per uuid of the batch, what the encoder reported; items it reported nothing for are absent.

    vLLM 0.33 encoders answer `ec_transfer_params: {mm_hash: {"item_indices": [...], "metadata": {...}, ...}}`.
    An entry is matched to the batch by `item_indices`, else by mm_hash == uuid, else (one item, one entry) by
    being the only one. Anything inconsistent is the encoder's fault: BackendUnavailableError, so it is retried.
    """
    params = answer.get("ec_transfer_params") if isinstance(answer, Mapping) else None
    if not isinstance(params, Mapping):
        return {}
    by_uuid = {item.uuid: item for item in batch.items}
    found: dict[str, Encoded] = {}
    for mm_hash, reported in params.items():
        if not isinstance(reported, Mapping):
            continue
        targets: list[str] = []
        indices = reported.get("item_indices")
        if isinstance(indices, list) and indices:
            for index in indices:
                if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(batch.items):
                    raise BackendUnavailableError(f"encoder {encoder} reported item index {index!r} outside its batch")
                targets.append(batch.items[index].uuid)
        elif mm_hash in by_uuid:
            targets.append(mm_hash)
        elif len(batch.items) == 1 and len(params) == 1:
            targets.append(batch.items[0].uuid)
        raw_meta = reported.get("metadata")
        metadata = {k: _flatten(v) for k, v in raw_meta.items()} if isinstance(raw_meta, Mapping) else {}
        for target in targets:
            if target in found and found[target].mm_hash != mm_hash:
                raise BackendUnavailableError(f"encoder {encoder} reported two keys for one item")
            found[target] = Encoded(str(mm_hash), metadata, dict(reported))
    return found


def consumer_body(
    request: Mapping[str, Any],
    items: Sequence[MediaItem],
    encoded: Mapping[str, Encoded],
    transfer_ids: Mapping[str, str],
) -> dict[str, Any]:
    """The request for the EC consumer (prefill or PD): media with metadata become references.

    `transfer_ids` (uuid -> id) is filled only for push connectors; then `ec_transfer_params.ec_items` gets one
    entry per media position, `{mm_hash, transfer_id}`, which is how the consumer matches pushes. Each encoder's
    reported entry is also passed under its mm_hash, as connectors that publish handles read them there.
    """
    if not items:
        return dict(request)
    messages = [dict(m) if isinstance(m, Mapping) else m for m in request["messages"]]
    touched: set[int] = set()
    referenced = references(items, encoded)
    for item in items:
        done = encoded.get(item.uuid)
        if item.message not in touched:
            messages[item.message]["content"] = list(messages[item.message]["content"])
            touched.add(item.message)
        if done is not None and item.uuid in referenced:
            kind = MEDIA_TYPES[item.type]
            new_part: dict[str, Any] = {"type": kind, kind: done.metadata, "uuid": item.uuid}
        else:
            new_part = {**item.content, "uuid": item.uuid}
        messages[item.message]["content"][item.part] = new_part
    body = {**request, "messages": messages}
    ec_params: dict[str, Any] = dict(request.get("ec_transfer_params") or {})
    for done in encoded.values():
        ec_params[done.mm_hash] = done.reported
    if transfer_ids:
        ec_params["ec_items"] = [_ec_item(encoded.get(i.uuid), transfer_ids[i.uuid]) for i in items]
    if ec_params:
        body["ec_transfer_params"] = ec_params
    return body


def references(items: Sequence[MediaItem], encoded: Mapping[str, Encoded]) -> frozenset[str]:
    """The uuids of the items the consumer gets as references: those the encoder reported metadata for, unless an
    item of the same kind got none (vLLM refuses raw media and references of one kind together)."""
    reported = {i.uuid for i in items if i.uuid in encoded and encoded[i.uuid].metadata}
    raw_kinds = {MEDIA_TYPES[i.type] for i in items if i.uuid not in reported}
    return frozenset(i.uuid for i in items if i.uuid in reported and MEDIA_TYPES[i.type] not in raw_kinds)


def _ec_item(done: Encoded | None, transfer_id: str) -> dict[str, str]:
    """One consumer `ec_items` entry; mm_hash only when the encoder reported it (a guessed one must not be sent:
    the consumer would wait for a key nobody pushes)."""
    if done is None:
        return {"transfer_id": transfer_id}
    return {"mm_hash": done.mm_hash, "transfer_id": transfer_id}


def with_uuids(request: Mapping[str, Any], items: Sequence[MediaItem]) -> dict[str, Any]:
    """The request with its media unchanged but named by the proxy's uuids, for a decode after a prefill.

    The decode has no EC connector, so it must not get references; it gets the media, which it needs only for
    tokens the KV hand-over did not cover, and the same uuids, so content-keyed KV connectors (ExampleConnector
    keys on image hashes) find what the prefill stored.
    """
    body = {k: v for k, v in request.items() if k != "ec_transfer_params"}
    if not items:
        return body
    messages = [dict(m) if isinstance(m, Mapping) else m for m in request["messages"]]
    touched: set[int] = set()
    for item in items:
        if item.message not in touched:
            messages[item.message]["content"] = list(messages[item.message]["content"])
            touched.add(item.message)
        messages[item.message]["content"][item.part] = {**item.content, "uuid": item.uuid}
    body["messages"] = messages
    return body
