"""The canaries' pure parts: which pairs exist, when one is due, when it leaves routing, what a canary sends."""

from __future__ import annotations

import base64
import io
import struct
import wave
import zlib

from epd_connectors.config.roles import Role
from epd_connectors.proxy.canary import (
    AUDIO_RATE,
    AUDIO_SAMPLES,
    IMAGE_SIDE,
    Pair,
    PairState,
    TransferPath,
    canary_body,
    is_due,
    noise_bytes,
    pairs_of,
    png,
    record,
    wav,
)
from epd_connectors.proxy.roster import InstanceSpec, Roster
from epd_connectors.proxy.settings import Canary

CANARY = Canary(interval_s=60.0, retry_s=5.0, timeout_s=10.0, failures=2)


def roster(**roles: list[str]) -> Roster:
    return Roster.build({Role(r): [InstanceSpec(u) for u in urls] for r, urls in roles.items()}, healthy=True)


def test_pairs_are_every_healthy_encoder_with_every_consumer_and_every_prefill_with_every_decode() -> None:
    split = roster(encoder=["e0", "e1"], prefill=["p0"], decode=["d0", "d1"])
    split.get(Role.ENCODER, "e1").healthy = False  # type: ignore[union-attr]
    assert pairs_of(split) == [
        Pair(TransferPath.EC, "e0", "p0"),
        Pair(TransferPath.KV, "p0", "d0"),
        Pair(TransferPath.KV, "p0", "d1"),
    ]
    assert pairs_of(roster(encoder=["e0"], pd=["a", "b"])) == [
        Pair(TransferPath.EC, "e0", "a"),
        Pair(TransferPath.EC, "e0", "b"),
    ]
    assert pairs_of(roster(pd=["a"])) == [], "no encoder and no split: nothing transfers"


def test_a_pair_is_due_when_new_after_its_interval_and_a_failing_one_backs_off_to_the_interval() -> None:
    assert is_due(None, 0.0, CANARY) and is_due(PairState(), 0.0, CANARY)
    ok = PairState(checked=True, checked_at=100.0)
    assert not is_due(ok, 159.0, CANARY) and is_due(ok, 160.0, CANARY)
    waits = []
    for failures in range(1, 7):
        state = PairState(checked=True, checked_at=0.0, failures=failures)
        waits.append(next(t for t in range(0, 120) if is_due(state, float(t), CANARY)))
    assert waits == [5, 10, 20, 40, 60, 60]


def test_a_pair_leaves_routing_after_the_failures_in_a_row_and_returns_on_one_pass() -> None:
    state = PairState()
    assert not record(state, "timeout", 10.0, 1.0, CANARY) and not state.failing and state.error == "timeout"
    assert record(state, "timeout", 10.0, 2.0, CANARY) and state.failing and state.failures == 2
    assert not record(state, "500", 0.2, 3.0, CANARY) and state.failing
    assert record(state, None, 0.1, 4.0, CANARY) and not state.failing
    assert (state.failures, state.error, state.latency_s, state.checked_at) == (0, "", 0.1, 4.0)


def test_the_canary_image_is_a_valid_png_of_fresh_pixels() -> None:
    noise = noise_bytes()
    data = png(IMAGE_SIDE, noise[: IMAGE_SIDE * IMAGE_SIDE * 3])
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert length == 13
    assert kind == b"IHDR" and struct.unpack(">II", data[16:24]) == (IMAGE_SIDE, IMAGE_SIDE)
    idat_at = data.index(b"IDAT")
    (idat_len,) = struct.unpack(">I", data[idat_at - 4 : idat_at])
    rows = zlib.decompress(data[idat_at + 4 : idat_at + 4 + idat_len])
    assert len(rows) == IMAGE_SIDE * (1 + IMAGE_SIDE * 3) and rows[1:4] == noise[:3]
    assert noise_bytes() != noise


def test_an_ec_canary_asks_about_an_image_and_a_kv_canary_sends_random_words_for_one_token() -> None:
    ec = canary_body(TransferPath.EC, noise_bytes())
    kv = canary_body(TransferPath.KV, noise_bytes())
    assert ec["max_tokens"] == kv["max_tokens"] == 1 and "model" not in ec
    assert ec["messages"][0]["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert len(kv["messages"][0]["content"].split()) == 48


def test_an_audio_canary_sends_a_wav_that_the_standard_library_reads_as_16_khz_mono_noise() -> None:
    noise = noise_bytes()
    ec = canary_body(TransferPath.EC, noise, "audio")
    part = ec["messages"][0]["content"][0]
    assert part["type"] == "input_audio" and part["input_audio"]["format"] == "wav"
    with wave.open(io.BytesIO(base64.b64decode(part["input_audio"]["data"]))) as clip:
        assert (clip.getnchannels(), clip.getsampwidth(), clip.getframerate()) == (1, 2, AUDIO_RATE)
        assert clip.getnframes() == AUDIO_SAMPLES and clip.readframes(4) == noise[:8]
    assert wav(AUDIO_RATE, b"") != wav(AUDIO_RATE // 2, b""), "the header carries the rate"
