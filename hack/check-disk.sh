#!/usr/bin/env bash
# Fails `make test` at once, with the figures, when the disk cannot hold what the run is about to write: a full disk
# otherwise shows as a pip or buildah error deep in one stage's output (a CI run of 2026-12-06 ended that way
# after 4 minutes, two old clones beside it holding 52 GB). Each part still missing counts with its measured size
# (2 cores, 2026-12-06), rounded up; what exists already counts nothing.
set -euo pipefail
venv=${1:-.venv} venv_e2e=${2:-.venv-e2e} venv_vllm033=${3:-.venv-vllm033} venv_vllm034=${4:-.venv-vllm034}
slack_gb=3
need_gb=$slack_gb
missing=""
count() {  # count NAME GB PATH: NAME's GB when PATH does not exist yet
  if [ ! -e "$3" ]; then need_gb=$(( need_gb + $2 )); missing+="${missing:+, }$1 $2 GB"; fi
}
count "$venv" 1 "$venv/.epd-setup-stamp"
count "$venv_e2e (CPU vLLM)" 7 "$venv_e2e/.epd-setup-stamp"
count "$venv_vllm033" 6 "$venv_vllm033/.epd-setup-stamp"
count "$venv_vllm034" 1 "$venv_vllm034/.epd-setup-stamp"
count "Go build cache and binaries" 6 .cache/bin/kube-apiserver
count "the real node's containerd root" 7 .cache/containerd
count "images (buildah's storage)" 7 /var/lib/containers/storage
avail_gb=$(df --output=avail -BG . | tail -n 1 | tr -dc 0-9)
if (( avail_gb < need_gb )); then
  echo "make test: $avail_gb GB free on the disk of $PWD, and this run writes about $need_gb GB:" \
    "${missing:-nothing new} and $slack_gb GB to work in." >&2
  echo "Fix: free $(( need_gb - avail_gb )) GB or more (other clones' .venv-e2e, .venv-vllm033, .venv-vllm034 and .cache/," \
    "or old images: buildah rmi --prune), then run make test again." >&2
  exit 1
fi
echo "disk: $avail_gb GB free, about $need_gb GB needed${missing:+ ($missing)}"
