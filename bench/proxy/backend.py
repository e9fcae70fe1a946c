"""A minimal, fast OpenAI-shaped backend for the proxy benchmark: raw asyncio, keep-alive HTTP/1.1.

It answers POST /v1/chat/completions (a fixed completion, or a short SSE stream when the body asks for one),
GET /health, GET /v1/models and GET /version, with as little work per request as possible, so that the
benchmark measures the routers in front of it and not the backend. A one-token request (a prefill) is answered
with kv_transfer_params, as a vLLM prefill with a KV connector answers, so every router's P/D mode hands them
to the decode. /version lets smg recognise a vLLM worker (its vLLM P/D path). Run: `python bench/proxy/backend.py
PORT [PORT ...]` (one process serving every port).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys

COMPLETION = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "bench",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok ok ok ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 8, "completion_tokens": 4, "total_tokens": 12},
    }
).encode()
EVENTS = [
    b"data: "
    + json.dumps(
        {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d}]}
    ).encode()
    + b"\n\n"
    for d in ({"role": "assistant"}, {"content": "ok"}, {"content": " ok"}, {"content": " ok"})
] + [b"data: [DONE]\n\n"]


def _response(status: bytes, content_type: bytes, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\ncontent-type: "
        + content_type
        + b"\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


JSON_ANSWER = _response(b"200 OK", b"application/json", COMPLETION)
KV_PARAMS = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_engine_id": "bench",
    "remote_block_ids": [0],
    "remote_host": "127.0.0.1",
    "remote_port": 5600,
    "tp_size": 1,
}
PREFILL_ANSWER = _response(
    b"200 OK", b"application/json", json.dumps({**json.loads(COMPLETION), "kv_transfer_params": KV_PARAMS}).encode()
)
ONE_TOKEN = re.compile(rb'"max_tokens":\s*1[,}]')
VERSION = _response(b"200 OK", b"application/json", b'{"version":"0.0.0+bench"}')
HEALTH = _response(b"200 OK", b"text/plain", b"")
MODELS = _response(b"200 OK", b"application/json", b'{"object":"list","data":[{"id":"bench"}]}')
NOT_FOUND = _response(b"404 Not Found", b"text/plain", b"")
STREAM = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    + b"".join(f"{len(e):x}\r\n".encode() + e + b"\r\n" for e in EVENTS)
    + b"0\r\n\r\n"
)


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.WriteTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport is not asyncio.Transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            length = 0
            at = head.find(b"content-length:")
            if at >= 0:
                length = int(head[at + 15 : head.find(b"\r\n", at) if head.find(b"\r\n", at) > 0 else None])
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            line = head[: head.find(b"\r\n")] if b"\r\n" in head else head
            assert self.transport is not None
            if line.startswith(b"post") and b"completions" in line:
                if ONE_TOKEN.search(body):
                    self.transport.write(PREFILL_ANSWER)
                else:
                    self.transport.write(STREAM if b'"stream":true' in body.replace(b" ", b"") else JSON_ANSWER)
            elif b" /health" in line:
                self.transport.write(HEALTH)
            elif b" /v1/models" in line:
                self.transport.write(MODELS)
            elif b" /version" in line:
                self.transport.write(VERSION)
            else:
                self.transport.write(NOT_FOUND)


async def serve(ports: list[int]) -> None:
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(_Connection, "127.0.0.1", port, backlog=4096) for port in ports]
    print(f"backend listening on {ports}", flush=True)
    await asyncio.gather(*(server.serve_forever() for server in servers))


if __name__ == "__main__":
    listen = [int(port) for port in sys.argv[1:]]
    try:
        import uvloop

        uvloop.run(serve(listen))
    except ImportError:
        asyncio.run(serve(listen))
