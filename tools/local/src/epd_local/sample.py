"""A sample request for a locally running deployment: a chat completion with one generated image, and a curl
line a user can paste. The image is made here (a 64x64 PNG, no Pillow), so the demo needs no files."""

from __future__ import annotations

import base64
import json
import struct
import urllib.error
import urllib.request
import zlib
from typing import Any

SAMPLE_PROMPT = "Describe this image."
CURL_PROMPT = "Hello, who are you?"


def png_bytes(width: int = 64, height: int = 64, seed: int = 0) -> bytes:
    """A deterministic RGB PNG whose pattern depends on `seed`."""
    rows = bytearray()
    for y in range(height):
        rows.append(0)  # filter: none
        for x in range(width):
            rows += bytes(((x * 4 + seed * 37) % 256, (y * 4 + seed * 91) % 256, ((x ^ y) * 8 + seed * 13) % 256))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(bytes(rows), 9)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def image_data_url(seed: int = 0) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(seed=seed)).decode()


def chat_body(model: str, *, image: bool = True, max_tokens: int = 16) -> dict[str, Any]:
    """Greedy, so the answer is the same every time (and equal to a single instance's)."""
    content: list[dict[str, Any]] = [{"type": "text", "text": SAMPLE_PROMPT if image else CURL_PROMPT}]
    if image:
        content.insert(0, {"type": "image_url", "image_url": {"url": image_data_url()}})
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 0,
    }


def curl_line(endpoint: str, model: str) -> str:
    """What to paste into a shell: a text-only chat completion (the runner's own sample adds an image)."""
    body = json.dumps(chat_body(model, image=False), separators=(",", ":"))
    return f"curl -s {endpoint}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'"


def ask(endpoint: str, body: dict[str, Any], timeout_s: float = 300.0) -> dict[str, Any]:
    """POST the chat completion; the parsed answer, or RuntimeError with the status and the body."""
    request = urllib.request.Request(
        f"{endpoint}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:1000]
        raise RuntimeError(f"POST {endpoint}/v1/chat/completions -> HTTP {exc.code}: {detail}") from exc


def answer_text(answer: dict[str, Any]) -> str:
    return str(answer["choices"][0]["message"]["content"])
