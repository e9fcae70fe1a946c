#!/usr/bin/env bash
# The cheap half of the GPU vLLM image, for every CI run: pip's resolver over the exact requirement set its
# Dockerfile installs (vllm and the CUDA Mooncake wheel at the Dockerfile's ARG defaults, epd-connectors built
# from this checkout), on this machine's platform, which is the image's (Debian bookworm, CPython 3.11, x86-64).
# VERSION resolves another vLLM (0.34.0: the gpu-0.34 flavour; its vllm==0.34.0 pins flashinfer-python==0.7.3,
# which the index this project's machines reach did not serve on 2026-12-07, so CI checks the default only).
# Nothing is installed (pip --dry-run); it fails when those pins stop resolving together, and prints the report's
# key versions. Building the image itself (`FLAVORS=gpu make images`) takes many GB of CUDA wheels.
# It also fails when the Mooncake wheel's CUDA major is not torch's (MOONCAKE_WHEEL=... tries another wheel).
#   images/resolve-gpu.sh [PYTHON] [VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-.venv/bin/python}
dockerfile=images/vllm/Dockerfile
arg() { sed -n "s/^ARG $1=//p" "$dockerfile" | head -n 1; }
vllm=${2:-$(arg VLLM_VERSION)} mooncake=$(arg MOONCAKE_VERSION) mooncake_wheel=${MOONCAKE_WHEEL:-$(arg MOONCAKE_WHEEL)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$SECONDS
cp -r connectors "$work/src"  # setuptools writes build/ beside the sources it builds
"$python" -m pip wheel --quiet --no-deps --wheel-dir "$work" "$work/src"
"$python" -m pip install --quiet --dry-run --ignore-installed --report "$work/report.json" \
  "vllm==$vllm" "$mooncake_wheel==$mooncake" "$work"/epd_connectors-*.whl
"$python" - "$work/report.json" "$((SECONDS - start))" "$mooncake_wheel" <<'EOF'
import json, re, sys
report, seconds, mooncake = sys.argv[1:]
found = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.load(open(report))["install"]}
keys = ("vllm", "torch", mooncake, "epd-connectors", "nvidia-cuda-runtime")
print(f"images: the GPU vLLM {found['vllm']} image's requirements resolve ({seconds} s): {len(found)} packages, "
      + ", ".join(f"{k} {found.get(k)}" for k in keys))
# The plain Mooncake wheel is built for CUDA 12 (it links libcudart.so.12); a -cudaNN one for CUDA NN.
suffix = re.search(r"cuda(\d+)$", mooncake)
wheel_cuda = int(suffix.group(1)) if suffix else 12
torch_cuda = int(found["nvidia-cuda-runtime"].split(".")[0])
if wheel_cuda != torch_cuda:
    sys.exit(f"images: {mooncake} is built for CUDA {wheel_cuda}, torch {found['torch']} brings CUDA {torch_cuda}")
EOF
