#!/usr/bin/env bash
# The vLLM 0.33.0 checker virtualenv (.venv-vllm033, about 5.5 GB): the PyPI vllm==0.33.0 wheel (the GPU images'
# vLLM) with --no-deps beside torch 2.14.0 and only the packages vLLM's parser and config path import
# (hack/requirements-vllm033.txt). It never serves: tests/vllm runs tests/vllm/vllm_check.py in it with
# VLLM_TARGET_DEVICE=cpu to judge rendered argv with vLLM 0.33's own code. .venv-e2e (vLLM 0.32, CPU build) is
# the other pinned vLLM. Downloads stay in pip's cache; pip re-runs only when the files that define the
# environment change (a stamp holds their hash).
set -euo pipefail
venv=${1:-.venv-vllm033}
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
inputs=(hack/requirements-vllm033.txt hack/setup-vllm033.sh)
want=$(cat "${inputs[@]}" | sha256sum | cut -d' ' -f1)
stamp="$venv/.epd-setup-stamp"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  exit 0
fi
echo "setup-vllm033: preparing $venv (vLLM 0.33.0 for its parser and config checks, about 5.5 GB)"
started=$(date +%s)
rm -rf "$venv"  # a changed pin list must not leave packages of the previous one behind
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/pip" install -q --no-deps -r hack/requirements-vllm033.txt
VLLM_TARGET_DEVICE=cpu "$venv/bin/python" -c \
  "import vllm.engine.arg_utils, vllm.entrypoints.common.cli_args; print('setup-vllm033: vllm', vllm.__version__)" \
  2>&1 | tail -n 1
echo "$want" > "$stamp"
echo "setup-vllm033: $venv ready in $(( $(date +%s) - started ))s, $(du -sh "$venv" | cut -f1)"
