#!/usr/bin/env python3
"""Make the tiny random-weight Qwen2-Audio that the audio e2e test serves with real vLLM; no model hub is involved.

Built like the tiny Qwen2-VL (make_tiny_qwen2vl.py, whose tokenizer training, weight draw and cache it uses):
cached in ``.cache/models/tiny-qwen2-audio/<key>``, the same bytes on every run.

Sizes: text hidden 128, 2 layers, 2 heads / 1 KV head; audio encoder 2 layers, d_model 64, 16 mel bins;
weights N(0, 0.2) so the output visibly depends on the audio; bf16. The audio encoder keeps Whisper's 1500
source positions: transformers and vLLM both pad the log-mel input to 3000 frames (30 s), so a 1 s clip at
16 kHz becomes 25 audio tokens. A ~400-token byte-level BPE with Qwen2-Audio's special tokens and a chat template
that writes "Audio N: <|audio_bos|><|AUDIO|><|audio_eos|>" per clip.

The weights are written under vLLM's names (``language_model.model.*``, ``audio_tower.*``): transformers 5.19's
save_pretrained writes ``language_model.model.model.*`` for this model, and vLLM 0.32's Qwen2-Audio maps no
names, so it would refuse the checkpoint.

Prints the model folder as the last line on stdout (``--hashes``: the files' sha256 as a JSON line before it).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from make_tiny_qwen2vl import INIT_STD, REPO, build_tokenizer, cache_key, greedy, randomize, run, say, text_config

NAME = "tiny-qwen2-audio"
CACHE_ROOT = REPO / ".cache" / "models" / NAME
N_MELS = 16
SAMPLING_RATE = 16000

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>"]
"""Qwen2-Audio's added tokens; they get the ids 0..5 here (the model never relies on the ids)."""

CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'audio' or 'audio' in content or 'audio_url' in content or 'input_audio' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}"
    "Audio {{ audio_count.value }}: <|audio_bos|><|AUDIO|><|audio_eos|>\n"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""Qwen2-Audio's chat template (one audio placeholder per clip)."""

CORPUS = [
    "You are a helpful assistant.",
    "What is that sound? Describe the audio in one sentence.",
    "A bird sings, a dog barks, rain falls; the speaker says hello and counts to ten.",
    "The quick brown fox jumps over the lazy dog.",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000, . ; : ! ? ' \" ( ) [ ] { } < > / - _ + = * & % $ # @",
]
"""What the BPE merges are learned from: fixed text, so the tokenizer is the same every run."""

RENAMES = (
    ("model.audio_tower.", "audio_tower."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
    ("model.language_model.", "language_model.model."),
    ("lm_head.", "language_model.lm_head."),
)
"""transformers' parameter names -> the checkpoint names vLLM's Qwen2-Audio loads."""


def build_model(out: Path, token_ids: dict[str, int], seed: int) -> None:
    import torch  # type: ignore[import-not-found]  # noqa: PLC0415
    from safetensors.torch import save_file  # type: ignore[import-not-found]  # noqa: PLC0415
    from transformers import Qwen2AudioConfig, Qwen2AudioForConditionalGeneration  # noqa: PLC0415

    config = Qwen2AudioConfig(
        audio_config={
            "model_type": "qwen2_audio_encoder",
            "num_mel_bins": N_MELS,
            "encoder_layers": 2,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 128,
            "d_model": 64,
            "max_source_positions": 1500,
            "initializer_range": INIT_STD,
        },
        text_config=text_config(token_ids, model_type="qwen2"),
        audio_token_index=token_ids["<|AUDIO|>"],
        tie_word_embeddings=True,
        dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = randomize(Qwen2AudioForConditionalGeneration(config), seed)
    state = {}
    for key, tensor in model.state_dict().items():
        renamed = next((new + key[len(old) :] for old, new in RENAMES if key.startswith(old)), None)
        if renamed is None:
            raise SystemExit(f"{NAME}: no checkpoint name for the parameter {key}")
        if renamed != "language_model.lm_head.weight":  # tied to the embedding
            state[renamed] = tensor.contiguous().clone()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.architectures = ["Qwen2AudioForConditionalGeneration"]
    config.save_pretrained(str(out))
    greedy(model, token_ids)
    model.generation_config.save_pretrained(str(out))


def build_processor(out: Path) -> None:
    """Whisper's log-mel features at 16 kHz over 30 s windows, saved with the tokenizer as one processor."""
    from transformers import AutoTokenizer, Qwen2AudioProcessor, WhisperFeatureExtractor  # noqa: PLC0415

    features = WhisperFeatureExtractor(
        feature_size=N_MELS,
        sampling_rate=SAMPLING_RATE,
        hop_length=160,
        chunk_length=30,
        n_fft=400,
        padding_value=0.0,
        return_attention_mask=True,
    )
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    processor = Qwen2AudioProcessor(feature_extractor=features, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(str(out))
    features.save_pretrained(str(out))


def build(out: Path, quiet: bool, seed: int) -> None:
    started = time.monotonic()
    token_ids = build_tokenizer(out, SPECIAL_TOKENS, CORPUS, CHAT_TEMPLATE)
    say(quiet, f"tokenizer: {token_ids['']} tokens ({time.monotonic() - started:.1f}s)", NAME)
    build_model(out, token_ids, seed)
    say(quiet, f"model written ({time.monotonic() - started:.1f}s)", NAME)
    build_processor(out)
    say(quiet, f"processor written ({time.monotonic() - started:.1f}s)", NAME)


def main(argv: list[str] | None = None) -> int:
    description = __doc__.splitlines()[0] if __doc__ else ""
    key = cache_key(Path(__file__))
    return run(argv, name=NAME, cache_root=CACHE_ROOT, key=key, build=build, description=description)


if __name__ == "__main__":
    sys.exit(main())
