"""What the proxy says an instance answered when it failed: the message of vLLM's error body, not its JSON."""

from __future__ import annotations

import pytest

from epd_connectors.proxy.backend import backend_message

pytestmark = pytest.mark.unit

ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."


@pytest.mark.parametrize(
    ("payload", "said"),
    [
        (
            b'{"error": {"message": "' + ENGINE_DEAD.encode() + b'", "type": "InternalServerError", "code": 500}}',
            ENGINE_DEAD,
        ),
        (b'{"detail": "Not Found"}', '{"detail": "Not Found"}'),
        (b'{"error": "plain"}', '{"error": "plain"}'),
        (b'{"error": {"message": ""}}', '{"error": {"message": ""}}'),
        (b"[1, 2]", "[1, 2]"),
        (b"Internal Server Error", "Internal Server Error"),
        (b"\xff\xfe broken", "\ufffd\ufffd broken"),
    ],
    ids=["vllm-error", "no-error-key", "error-not-object", "empty-message", "not-an-object", "text", "not-utf8"],
)
def test_the_message_of_an_error_body_or_its_text(payload: bytes, said: str) -> None:
    assert backend_message(payload) == said


def test_it_is_cut_to_the_limit() -> None:
    assert backend_message(b'{"error": {"message": "' + b"x" * 900 + b'"}}', limit=10) == "x" * 10
    assert len(backend_message(b"y" * 900)) == 500
