"""What the operator renders for vLLM, as the checker's cases: every example and a bounded set of variants of them.

Each vLLM role's bundle goes through epd-launch's own plan (plan_launch), so a case's argv, environment and Mooncake
JSON are exactly what the pod would exec and read; only the model path is replaced by the tiny model's (vLLM's
create_engine_config reads the model's config, and the examples' weights are not on this machine).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from epd_connectors.config.bundle import parse_bundle
from epd_connectors.config.roles import VLLM_ROLES
from epd_connectors.config.vllm import DEFAULT_VLLM_VERSION
from epd_connectors.launch.plan import plan_launch
from epd_operator.api import constants as c
from epd_operator.api.resource import InvalidSpecError, OperatorDefaults, Owner, parse_spec
from epd_operator.render import render_desired

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
OWNER = Owner(name="demo", namespace="serving", uid="00000000-0000-4000-8000-000000000014")
POD_IP = "127.0.0.1"
DEFAULTS = OperatorDefaults(prometheus_url="http://prometheus.monitoring.svc:9090")
"""The operator's defaults with a Prometheus named, as examples/e-pd-autoscaled.yaml needs (vLLM never sees it)."""

Case = dict[str, Any]


def examples() -> dict[str, dict[str, Any]]:
    """Every examples/*.yaml's spec, by file stem."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(EXAMPLES.glob("*.yaml")):
        spec: dict[str, Any] = yaml.safe_load(path.read_text())["spec"]
        found[path.stem] = spec
    return found


V2_ONLY = "0.34"
"""The vLLM whose checker (.venv-vllm034) judges every example rendered for it; older checkers (.venv-e2e 0.32,
.venv-vllm033 0.33) judge the examples as written, which render for 0.33 unless they name a version."""


def _version(spec: dict[str, Any]) -> str:
    return str((spec.get("images") or {}).get("vllmVersion", DEFAULT_VLLM_VERSION))


def judged_examples(checker: str) -> dict[str, dict[str, Any]]:
    """The examples a checker of vLLM `checker` ("0.33.0") judges: for 0.34 every example, rendered for 0.34; for
    an older one, the examples not written for 0.34."""
    found = examples()
    if checker.startswith(V2_ONLY):
        return {
            name: {**spec, "images": {**(spec.get("images") or {}), "vllmVersion": V2_ONLY}}
            for name, spec in found.items()
        }
    return {name: spec for name, spec in found.items() if _version(spec) != V2_ONLY}


# One change at a time to an example: the settings that reach vLLM's argv, its transfer configs or the Mooncake
# JSON. A variant the operator refuses (InvalidSpecError) is not a case: only what it renders is judged.
VARIANTS: dict[str, tuple[tuple[str, ...], Any]] = {
    "dtype-float16": (("model", "dtype"), "float16"),
    "dtype-auto": (("model", "dtype"), "auto"),
    "block-size-64": (("model", "blockSize"), 64),
    "mm-cache-0": (("model", "mmProcessorCacheGB"), 0),
    "mm-cache-half": (("model", "mmProcessorCacheGB"), 0.5),
    "mm-kwargs": (("model", "mmProcessorKwargs"), {"max_pixels": 1003520, "do_resize": True}),
    "served-name": (("model", "servedModelName"), "served-name"),
    "encoder-budget": (("encoder", "maxNumBatchedTokens"), 4096),
    "encoder-buffer-cpu": (("encoder", "bufferDevice"), "cpu"),
    "encoder-cross-cache": (("encoder", "crossEncoderCache"), {"enabled": True, "prefix": "variant"}),
    "prefill-tp2": (("prefill", "tensorParallelSize"), 2),
    "prefill-eager": (("prefill", "enforceEager"), True),
    "prefill-pool-tp2": (("prefill", "additionalPools"), [{"name": "tp2", "tensorParallelSize": 2}]),
    "kv-mooncake": (("prefill", "kv"), {"connector": "mooncake"}),
    "kv-mooncake-store": (("prefill", "kv"), {"connector": "mooncake-store"}),
    "kv-mooncake+store": (("prefill", "kv"), {"connector": "mooncake+store", "lookupAsync": True}),
    "kv-shared-storage": (("prefill", "kv"), {"connector": "shared-storage"}),
    "decode-tp2": (("decode", "tensorParallelSize"), 2),
    "decode-not-eager": (("decode", "enforceEager"), False),
    "decode-budget": (("decode", "maxNumBatchedTokens"), 2048),
    "decode-save-cache": (("decode", "kv", "saveDecodeCache"), True),
    "decode-fail-policy": (("decode", "kv", "loadFailurePolicy"), "fail"),
    "store-embedded": (("store", "mode"), "embedded"),
    "store-tcp": (("store", "protocol"), "tcp"),
    "store-tenant": (("store", "tenant"), {"id": "variant-tenant", "isolation": True}),
}


def variant(spec: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any] | None:
    """`spec` with `path` set to `value`; None when a section on the way is absent (nothing to vary)."""
    changed = copy.deepcopy(spec)
    node = changed
    for key in path[:-1]:
        if key not in node and key not in ("kv",):
            return None
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return changed


COMBINATIONS = 24
"""Generated specs: this many draws of two to four variants applied together (a fixed seed, so every run judges
the same set and a failure reproduces)."""


def combinations(names: list[str]) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(example, variant labels) pairs drawn with a fixed seed; labels of one draw vary distinct settings."""
    draw = random.Random(14)
    for _ in range(COMBINATIONS):
        labels = draw.sample(sorted(VARIANTS), draw.randint(2, 4))
        paths = [VARIANTS[label][0] for label in labels]
        kept = tuple(label for i, label in enumerate(labels) if paths[i] not in paths[:i])
        yield draw.choice(names), kept


def specs(checker: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every example the checker of vLLM `checker` judges, every variant of each that changes something, then the
    generated combinations."""
    found = judged_examples(checker)
    for name, spec in found.items():
        yield name, spec
        for label, (path, value) in VARIANTS.items():
            changed = variant(spec, path, value)
            if changed is not None and changed != spec:
                yield f"{name}+{label}", changed
    for name, labels in combinations(sorted(found)):
        combined: dict[str, Any] | None = found[name]
        for label in labels:
            path, value = VARIANTS[label]
            combined = variant(combined, path, value) if combined is not None else None
        if combined is not None and combined != found[name]:
            yield f"{name}+{'+'.join(labels)}", combined


def cases(name: str, spec: dict[str, Any], *, model: Path, workdir: Path) -> list[Case]:
    """One case per vLLM role bundle of the rendered spec; empty when the operator refuses the spec."""
    try:
        desired = render_desired(OWNER, parse_spec(spec), DEFAULTS)
    except InvalidSpecError:
        return []
    found: list[Case] = []
    for obj in desired.objects:
        text = obj.get("data", {}).get(c.BUNDLE_FILE) if obj["kind"] == "ConfigMap" else None
        if text is None:
            continue
        bundle = parse_bundle(text)
        if bundle.role not in VLLM_ROLES:
            continue
        unit = obj["metadata"]["name"].removesuffix("-bundle")
        where = workdir / name / unit
        where.mkdir(parents=True, exist_ok=True)
        plan = plan_launch(
            bundle, workdir=str(where), bundle_path=str(where / "bundle.json"), environ={"POD_IP": POD_IP}
        )
        for path, content in plan.files.items():
            Path(path).write_text(content, encoding="utf-8")
        assert bundle.vllm is not None
        found.append(case(f"{name}/{unit}", plan.argv[3:], plan.env, model=model, extra=len(bundle.vllm.extra_args)))
    return found


def case(name: str, argv: list[str], env: dict[str, str], *, model: Path, extra: int = 0) -> Case:
    """A checker case: `argv` with the tiny model's path, the launcher's env and its Mooncake JSON (if any);
    `extra`: how many of argv's last arguments are the spec's extraArgs (the rest is what the operator owns)."""
    argv = list(argv)
    argv[argv.index("--model") + 1] = str(model)
    return {
        "name": name,
        "argv": argv,
        "owned_argv": argv[: len(argv) - extra],
        "env": env,
        "mooncake_config": env.get("MOONCAKE_CONFIG_PATH"),
        # Model Runner V2 (the cross-encoder cache) needs Triton, which only a GPU has: the checker stands in.
        "triton": env.get("VLLM_USE_V2_MODEL_RUNNER") == "1",
    }
