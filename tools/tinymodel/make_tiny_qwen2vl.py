#!/usr/bin/env python3
"""Make the tiny random-weight Qwen2-VL that the e2e tests serve with real vLLM; no model hub is involved.

Runs in the e2e virtualenv (``make setup-e2e``), where torch, transformers and tokenizers are installed. The
model is cached in ``.cache/models/tiny-qwen2-vl/<key>``, where the key hashes this script and the versions of
the libraries that write the files, so it is rebuilt only when one of them changes. The output is the same bytes
on every run: fixed seeds, a fixed training corpus for the tokenizer, single-threaded tokenizer training.

Sizes (shared/docs/facts.md): text hidden 128, 2 layers, 2 heads / 1 KV head, head_dim 64, mrope sections
[8, 12, 12]; vision depth 2, embed 64, patch 14, merge 2; weights N(0, 0.2) so the output visibly depends on the
image; bf16. A ~400-token byte-level BPE with the Qwen special tokens and a chat template. Images are resized to
between 56*56 and 112*112 pixels, so a 64x64 image becomes a [1, 4, 4] grid and 4 image tokens.

``--seed N`` makes another model of the same shape and tokenizer whose weights, hence answers, differ (the
real-pod tier rolls from one to the other as a new model revision); its folder is ``<key>-seed<N>``.

Prints the model folder as the last line on stdout (``--hashes``: the files' sha256 as a JSON line before it),
progress on stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CACHE_ROOT = REPO / ".cache" / "models" / "tiny-qwen2-vl"
SEED = 1234
INIT_STD = 0.2
VOCAB_SIZE = 400
MIN_PIXELS = 56 * 56
MAX_PIXELS = 112 * 112
LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors", "torchvision")

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
"""Qwen2-VL's added tokens, in Qwen's order; they get the ids 0..13 here (the model never relies on the ids)."""

CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""Qwen2-VL's chat template."""

CORPUS = [
    "You are a helpful assistant.",
    "Describe the image in one sentence.",
    "What is in this picture? What colour is it? How many objects are there?",
    "The quick brown fox jumps over the lazy dog. A red square, a blue circle and a green triangle.",
    "Hello, world! The encoder turns pixels into embeddings; the decoder writes text, one token at a time.",
    "system user assistant image video picture colour shape number left right top bottom",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000, . ; : ! ? ' \" ( ) [ ] { } < > / - _ + = * & % $ # @",
]
"""What the BPE merges are learned from: fixed text, so the tokenizer is the same every run."""


def cache_key(*scripts: Path) -> str:
    """Hash of this script (and `scripts`, the models that build on it) and of the libraries' versions that shape
    the files."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for script in scripts:
        digest.update(script.read_bytes())
    for name in LIBRARIES:
        digest.update(f"{name}=={metadata.version(name)}".encode())
    return digest.hexdigest()[:16]


def say(quiet: bool, line: str, name: str = "tiny-qwen2-vl") -> None:
    if not quiet:
        print(f"{name}: {line}", file=sys.stderr, flush=True)


def build_tokenizer(
    out: Path,
    special_tokens: list[str] = SPECIAL_TOKENS,
    corpus: list[str] = CORPUS,
    chat_template: str = CHAT_TEMPLATE,
) -> dict[str, int]:
    """Train the byte-level BPE, wrap it as a fast tokenizer and save it; returns the special tokens' ids (the
    vocabulary's size under "")."""
    # Imported here, not at the top: a cache hit must not pay for importing torch and transformers.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # type: ignore[import-not-found]  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # type: ignore[import-not-found]  # noqa: PLC0415

    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread: the merge order must not depend on timing
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=special_tokens[1:],
        model_max_length=4096,
        chat_template=chat_template,
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(out))
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    return {"": int(tok.get_vocab_size())} | {token: int(vocab[token]) for token in special_tokens}


def randomize(model: Any, seed: int) -> Any:
    """The model's weights drawn N(0, INIT_STD) from `seed` (biases 0, norm scales 1), explicitly rather than by
    transformers' defaults, which may change; returned in bf16."""
    import torch  # noqa: PLC0415

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if param.ndim >= 2:
                param.copy_(torch.randn(param.shape, generator=generator, dtype=torch.float32) * INIT_STD)
            elif name.endswith("bias"):
                param.zero_()
            else:  # norm scales
                param.fill_(1.0)
    return model.to(torch.bfloat16)


def text_config(token_ids: dict[str, int], **own: Any) -> dict[str, Any]:
    """The tiny Qwen2 language model of every tiny model here: hidden 128, 2 layers, 2 heads / 1 KV head, its
    special tokens' ids from `token_ids` (the vocabulary's size under ""); `own`: the model's own keys."""
    return {
        **own,
        "vocab_size": token_ids[""],
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "bos_token_id": token_ids["<|endoftext|>"],
        "eos_token_id": token_ids["<|im_end|>"],
        "pad_token_id": token_ids["<|endoftext|>"],
        "dtype": "bfloat16",
        "initializer_range": INIT_STD,
    }


def greedy(model: Any, token_ids: dict[str, int]) -> None:
    """The model's generation config: greedy, ending at <|im_end|> (the tests compare answers token for token)."""
    model.generation_config.do_sample = False
    model.generation_config.eos_token_id = token_ids["<|im_end|>"]
    model.generation_config.pad_token_id = token_ids["<|endoftext|>"]


def build_model(out: Path, token_ids: dict[str, int], seed: int = SEED) -> None:
    """Random-weight Qwen2-VL in bf16, initialised explicitly (not by transformers' defaults, which may change)."""
    import torch  # type: ignore[import-not-found]  # noqa: PLC0415
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration  # noqa: PLC0415

    config = Qwen2VLConfig(
        text_config=text_config(
            token_ids,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [8, 12, 12]},
        ),
        vision_config={
            "depth": 2,
            "embed_dim": 64,
            "hidden_size": 128,
            "mlp_ratio": 2,
            "num_heads": 2,
            "in_channels": 3,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "initializer_range": INIT_STD,
        },
        image_token_id=token_ids["<|image_pad|>"],
        video_token_id=token_ids["<|video_pad|>"],
        vision_start_token_id=token_ids["<|vision_start|>"],
        vision_end_token_id=token_ids["<|vision_end|>"],
        tie_word_embeddings=True,
        initializer_range=INIT_STD,
        dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = randomize(Qwen2VLForConditionalGeneration(config), seed)
    greedy(model, token_ids)
    model.save_pretrained(str(out), safe_serialization=True)


def build_processor(out: Path) -> None:
    """Image and video processors bounded to 56*56..112*112 pixels, saved with the tokenizer as one processor."""
    from transformers import AutoTokenizer, Qwen2VLImageProcessor, Qwen2VLProcessor  # noqa: PLC0415
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import (  # type: ignore[import-not-found]  # noqa: PLC0415
        Qwen2VLVideoProcessor,
    )

    size = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    common = {"patch_size": 14, "temporal_patch_size": 2, "merge_size": 2, "size": size}
    image = Qwen2VLImageProcessor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, **common)
    video = Qwen2VLVideoProcessor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, **common)
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    processor = Qwen2VLProcessor(
        image_processor=image, tokenizer=tokenizer, video_processor=video, chat_template=CHAT_TEMPLATE
    )
    processor.save_pretrained(str(out))
    # transformers 5 nests both in processor_config.json; the separate files serve readers that look for them.
    image.save_pretrained(str(out))
    video.save_pretrained(str(out))


def build(out: Path, quiet: bool, seed: int = SEED) -> None:
    started = time.monotonic()
    token_ids = build_tokenizer(out)
    say(quiet, f"tokenizer: {token_ids['']} tokens ({time.monotonic() - started:.1f}s)")
    build_model(out, token_ids, seed)
    say(quiet, f"model written ({time.monotonic() - started:.1f}s)")
    build_processor(out)
    say(quiet, f"processor written ({time.monotonic() - started:.1f}s)")


def file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file in the model folder, by name."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def readable_by_all(folder: Path) -> None:
    """The folder 0755 and its files 0644 (mkdtemp makes 0700): pods mount it as their model volume and read it
    as user 10001, not as the owner."""
    folder.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o755 if path.is_dir() else 0o644)


def run(
    argv: list[str] | None,
    *,
    name: str,
    cache_root: Path,
    key: str,
    build: Callable[[Path, bool, int], None],
    description: str,
) -> int:
    """The command line of a tiny model's script: build into the cache under `key` (or --out), print the folder."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, help="build into this folder instead of the cache (always rebuilds)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument("--hashes", action="store_true", help="also print the files' sha256 as one JSON line")
    parser.add_argument("--seed", type=int, default=SEED, help=f"the weights' seed (default {SEED})")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    folder = key if args.seed == SEED else f"{key}-seed{args.seed}"
    target: Path = args.out if args.out is not None else cache_root / folder
    if args.out is not None or not (target / "config.json").exists():
        started = time.monotonic()
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
        try:
            build(staging, args.quiet, args.seed)
            readable_by_all(staging)
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)  # atomic: a concurrent reader sees no half-written model
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        size = sum(p.stat().st_size for p in target.iterdir())
        say(args.quiet, f"built {target} in {time.monotonic() - started:.1f}s ({size / 1e6:.2f} MB)", name)
    if args.hashes:
        print(json.dumps(file_hashes(target), sort_keys=True))
    print(target)
    return 0


def main(argv: list[str] | None = None) -> int:
    description = __doc__.splitlines()[0] if __doc__ else ""
    return run(argv, name="tiny-qwen2-vl", cache_root=CACHE_ROOT, key=cache_key(), build=build, description=description)


if __name__ == "__main__":
    sys.exit(main())
