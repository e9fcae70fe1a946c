#!/usr/bin/env bash
# The cheap half of the GPU vLLM image, for every CI run: pip's resolver over the exact requirement set its
# Dockerfile installs (vllm and the CUDA Mooncake wheel at the Dockerfile's ARG defaults, epd-connectors built
# from this checkout), on this machine's platform, which is the image's (Debian bookworm, CPython 3.11, x86-64).
# Nothing is installed (pip --dry-run); it fails when those pins stop resolving together, and prints the report's
# key versions. Building the image itself (`FLAVORS=gpu make images`) takes many GB of CUDA wheels.
#   images/resolve-gpu.sh [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-.venv/bin/python}
dockerfile=images/vllm/Dockerfile
arg() { sed -n "s/^ARG $1=//p" "$dockerfile" | head -n 1; }
vllm=$(arg VLLM_VERSION) mooncake=$(arg MOONCAKE_VERSION)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$SECONDS
cp -r connectors "$work/src"  # setuptools writes build/ beside the sources it builds
"$python" -m pip wheel --quiet --no-deps --wheel-dir "$work" "$work/src"
"$python" -m pip install --quiet --dry-run --ignore-installed --report "$work/report.json" \
  "vllm==$vllm" "mooncake-transfer-engine==$mooncake" "$work"/epd_connectors-*.whl
"$python" - "$work/report.json" "$((SECONDS - start))" <<'EOF'
import json, sys
installs = json.load(open(sys.argv[1]))["install"]
found = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in installs}
keys = ("vllm", "torch", "mooncake-transfer-engine", "epd-connectors")
cuda = sum(1 for name in found if name.startswith("nvidia-"))
print(f"images: the GPU vLLM image's requirements resolve ({sys.argv[2]} s): {len(found)} packages, "
      + ", ".join(f"{k} {found[k]}" for k in keys) + f", {cuda} nvidia-* CUDA wheels")
EOF
