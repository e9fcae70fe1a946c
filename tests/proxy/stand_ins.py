"""Stand-in vLLM backends for the proxy's HTTP tests: tiny aiohttp apps on loopback in the test's event loop.

They are not vLLM: they answer the OpenAI routes with the shapes vLLM 0.33 uses (an encoder's
`ec_transfer_params` keyed by mm_hash with `item_indices` and `metadata`; SSE streams; /health; a
MooncakeConnector bootstrap `/query`) and can be told to fail, stall or cut a stream, which a real engine
cannot be made to do on demand. Tests against real vLLM live with the end-to-end tests.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

GRID = [[1, 4, 4]]
"""The metadata a stand-in encoder reports per image (a 64x64 image's grid in facts.md's tiny model)."""


@dataclass
class StandIn:
    """One stand-in instance; its fields steer what the next requests get."""

    name: str
    role: str = "pd"
    """encoder answers with ec_transfer_params; anything else generates text."""
    statuses: list[int] = field(default_factory=list)
    """Answer the next requests with these statuses (500, 400, ...) before behaving normally."""
    health: int = 200
    chunks: int = 3
    cut_after: int | None = None
    """Streams: drop the connection after this many chunks."""
    delay_s: float = 0.0
    """Wait this long before answering (a slow or stalled instance)."""
    chunk_delay_s: float = 0.0
    """Streams: wait this long before each chunk after the first (a model generating slowly)."""
    no_metadata: set[str] = field(default_factory=set)
    """Encoder: report nothing for these uuids."""
    unreachable_from: set[str] = field(default_factory=set)
    """Consumer or decode: fail (500 after `transfer_wait_s`) a request whose embeddings or KV come from these
    encoders or prefills, as vLLM does when a push or KV never arrives; a path broken on purpose."""
    transfer_wait_s: float = 0.2
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the proxy closed the connection while this instance was still answering."""
    disconnected_at: float = 0.0
    """The event loop's time when it noticed (polled every 10 ms)."""
    url: str = ""
    _runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completion)
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/query", self._query)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=self.health)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tiny", "owned_by": self.name}]})

    async def _query(self, request: web.Request) -> web.Response:
        return web.json_response({"0": {"engine_id": f"engine-{self.name}", "worker_addr": "x"}})

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        if self.statuses:
            status = self.statuses.pop(0)
            return web.json_response({"error": {"message": f"{self.name} says {status}"}}, status=status)
        if self._sender(body) in self.unreachable_from:
            await self._closed_within(request, self.transfer_wait_s)
            return web.json_response({"error": {"message": "Internal server error"}}, status=500)
        if self.delay_s and await self._closed_within(request, self.delay_s):
            return web.Response(status=499)
        if self.role == "encoder":
            return web.json_response(self._encoder_answer(body))
        if body.get("stream"):
            return await self._stream(request)
        return web.json_response(
            {
                "id": "cmpl-1",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": f"from {self.name}"}}],
                "kv_transfer_params": None,
            }
        )

    @staticmethod
    def _sender(body: dict[str, Any]) -> str | None:
        """The stand-in encoder or prefill this request's embeddings or KV come from, if any."""
        for entry in (body.get("ec_transfer_params") or {}).values():
            if isinstance(entry, dict) and "producer" in entry:
                return str(entry["producer"])
        engine = (body.get("kv_transfer_params") or {}).get("remote_engine_id")
        return engine.removeprefix("engine-") if isinstance(engine, str) else None

    async def _closed_within(self, request: web.Request, seconds: float) -> bool:
        """Wait up to `seconds`; True (and `disconnected` set) when the client hung up meanwhile."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while loop.time() < deadline:
            if request.transport is None or request.transport.is_closing():
                self.disconnected_at = loop.time()
                self.disconnected.set()
                return True
            await asyncio.sleep(0.01)
        return False

    def _encoder_answer(self, body: dict[str, Any]) -> dict[str, Any]:
        params: dict[str, Any] = {}
        for index, part in enumerate(body["messages"][0]["content"]):
            uuid = part.get("uuid")
            if uuid in self.no_metadata:
                continue
            params[uuid] = {
                "modality": "image",
                "item_indices": [index],
                "metadata": {"image_grid_thw": GRID},
                "producer": self.name,
            }
        return {"id": "enc", "choices": [], "ec_transfer_params": params or None}

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for i in range(self.chunks):
            if i and self.chunk_delay_s and await self._closed_within(request, self.chunk_delay_s):
                return response
            if self.cut_after is not None and i >= self.cut_after:
                assert request.transport is not None
                request.transport.close()
                return response
            event = {"choices": [{"index": 0, "delta": {"content": f"{self.name}-{i}"}}]}
            await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None and isinstance(server, asyncio.base_events.Server)
        port = server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


@asynccontextmanager
async def running(*stand_ins: StandIn) -> AsyncIterator[tuple[StandIn, ...]]:
    """Start the stand-ins on loopback; stop them after."""
    try:
        for s in stand_ins:
            await s.start()
        yield stand_ins
    finally:
        for s in stand_ins:
            await s.stop()
