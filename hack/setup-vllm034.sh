#!/usr/bin/env bash
# The vLLM 0.34.0 checker virtualenv (.venv-vllm034, about 0.6 GB): the PyPI vllm==0.34.0 wheel with --no-deps, over
# .venv-vllm033's packages (a .pth file puts that venv's site-packages after this one's). 0.34's requirements are
# 0.33's with raised floors that .venv-vllm033's pins already meet (torch 2.14.0 for both), so one 5.5 GB set serves
# both parsers. It never serves: tests/vllm runs tests/vllm/vllm_check.py in it, standing in for the Triton that
# 0.34's CPU platform requires on x86 (triton-cpu is not on PyPI). Re-runs only when its inputs change.
set -euo pipefail
venv=${1:-.venv-vllm034}
base=${2:-.venv-vllm033}
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
inputs=(hack/requirements-vllm034.txt hack/setup-vllm034.sh hack/requirements-vllm033.txt)
want=$(cat "${inputs[@]}" | sha256sum | cut -d' ' -f1)
stamp="$venv/.epd-setup-stamp"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  exit 0
fi
[ -f "$base/.epd-setup-stamp" ] || { echo "setup-vllm034: $base is missing: run make setup-vllm033 first" >&2; exit 1; }
echo "setup-vllm034: preparing $venv (vLLM 0.34.0 over $base, for its parser and config checks)"
started=$(date +%s)
rm -rf "$venv"
"$python" -m venv "$venv"
site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
base_site=$("$base/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$(cd "$base_site" && pwd)" > "$site/zz-epd-vllm033.pth"
"$venv/bin/pip" install -q --no-deps -r hack/requirements-vllm034.txt
VLLM_TARGET_DEVICE=cpu "$venv/bin/python" -c \
  "import vllm.engine.arg_utils, vllm.entrypoints.common.cli_args; print('setup-vllm034: vllm', vllm.__version__)" \
  2>&1 | tail -n 1
echo "$want" > "$stamp"
echo "setup-vllm034: $venv ready in $(( $(date +%s) - started ))s, $(du -sh "$venv" | cut -f1)"
