#!/usr/bin/env bash
# `make test` (and so CI): the machine's set-up, lint and every tier, each stage timed. The Go builds (CPU-bound)
# run beside the set-up that waits on the network and the disk (apt, virtualenvs, images), and the images are
# copied into the real node's containerd beside the first pytest run. Ends with the timeline (stages, the slowest
# tests, the total), also when a stage fails; kept in .run/timeline.txt.
# The pytest runs are five: the tiers before e2e as three runs side by side (hack/tiers.sh), the vllm tier beside
# them, and e2e only once the control planes and Mooncake processes of those are gone; all always run (one CI
# pass reports every tier) and the run fails if any did.
set -uo pipefail
cd "$(dirname "$0")/.."
venv=${VENV:-.venv}
venv_e2e=${VENV_E2E:-.venv-e2e}
venv_vllm033=${VENV_VLLM033:-.venv-vllm033}
venv_vllm034=${VENV_VLLM034:-.venv-vllm034}
bin_dir=${BIN_DIR:-.cache/bin}
timeline=(python3 tools/testenv/src/epd_testenv/timeline.py)
export EPD_TIMELINE=$PWD/.run/timeline/stages.jsonl
rc=0
"${timeline[@]}" begin
# The timeline ends every run, a failed or interrupted one too; nothing started in the background outlives it.
trap 'kill $(jobs -p) 2>/dev/null; "${timeline[@]}" report --rc $rc' EXIT
trap 'rc=130; exit 130' INT
trap 'rc=143; exit 143' TERM

stage() { "${timeline[@]}" stage "$@"; }
# A set-up stage that fails ends the run (the tiers would only fail for want of it).
setup() { stage "$@" || { rc=$?; echo "make test: set-up stage '$1' failed (rc $rc)" >&2; exit "$rc"; }; }
# Lines of a stage that runs beside others, marked with its name.
marked() { sed -u -e "s/^/[$1] /"; }

setup "disk space" -- hack/check-disk.sh "$venv" "$venv_e2e" "$venv_vllm033" "$venv_vllm034"
stage "Go builds (control plane, kwok, helm, CoreDNS, Prometheus)" -- env BUILD_GROUPS=core \
  hack/build-k8s-tools.sh "$bin_dir" > >(marked go) 2>&1 &
go_builds=$!
# KEDA (only the real-pod tier runs it; a cold build is 12 CPU-minutes) once the control plane is built: beside
# the rest of the set-up and the tiers, waited for only before e2e.
stage "Go build: KEDA (after the other Go builds, beside the set-up and the tiers)" -- \
  bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 2; done; BUILD_GROUPS=keda exec hack/build-k8s-tools.sh "$2"' \
  keda "$go_builds" "$bin_dir" > >(marked keda) 2>&1 &
keda_build=$!
# One apt run for everything: the tests' packages and the daemonless image build's.
setup "apt" -- hack/setup-apt.sh buildah mmdebstrap runc podman
setup "virtualenv $venv" -- hack/setup-python.sh "$venv"
# pip's resolver over the GPU image's pins waits on the index: beside the rest of the set-up.
stage "GPU image requirements resolved (pip, dry run)" -- images/resolve-gpu.sh "$venv/bin/python" \
  > >(marked resolve-gpu) 2>&1 &
resolve_gpu=$!
stage "lint (ruff, mypy, import layers)" -- make --no-print-directory lint || rc=$?
setup "virtualenv $venv_e2e (CPU vLLM) and the tiny model" -- hack/setup-e2e.sh "$venv_e2e"
setup "virtualenv $venv_vllm033 (vLLM 0.33.0)" -- hack/setup-vllm033.sh "$venv_vllm033"
setup "virtualenv $venv_vllm034 (vLLM 0.34.0 over $venv_vllm033)" -- \
  hack/setup-vllm034.sh "$venv_vllm034" "$venv_vllm033"
setup "images: operator, proxy, mooncake" -- env IMAGES="operator proxy mooncake" images/build.sh
setup "images: CPU vLLM" -- env IMAGES=vllm FLAVORS=cpu images/build.sh
wait "$resolve_gpu" || { rc=$?; echo "make test: the GPU image's requirements did not resolve (rc $rc)" >&2; exit "$rc"; }
wait "$go_builds" || { rc=$?; echo "make test: the Go builds failed (rc $rc)" >&2; exit "$rc"; }

pytest=("$venv/bin/pytest")
junit() { echo "--junitxml=.run/timeline/junit-$1.xml"; }
export EPD_E2E_VENV=$venv_e2e EPD_VLLM033_VENV=$venv_vllm033 EPD_VLLM034_VENV=$venv_vllm034
# Beside the tiers, which mostly wait on their control planes and Mooncake processes: the copy of the images
# into the node's containerd (the disk) and the vllm tier (vLLM's own parser in three subprocesses;
# its output is printed once it is done).
stage "images into the real node's containerd (beside the tiers)" -- "$venv/bin/python" -m epd_testenv.cli \
  preload-images > >(marked containerd) 2>&1 &
preload=$!
vllm_log=.run/timeline/vllm.log
stage "pytest: vllm (rendered argv through the three vLLMs, beside the tiers)" -- "${pytest[@]}" -p no:cacheprovider \
  --basetemp=.run/pytest-vllm -m vllm "$(junit vllm)" > "$vllm_log" 2>&1 &
vllm_tier=$!
stage "pytest: every tier but e2e (three runs side by side)" -- env PYTEST="${pytest[0]}" hack/tiers.sh || rc=$?
wait "$vllm_tier" || rc=$?
echo "---- pytest -m vllm (it ran beside the run above) ----"
cat "$vllm_log"
wait "$keda_build" || { rc=$?; echo "make test: the KEDA build failed (rc $rc)" >&2; exit "$rc"; }
wait "$preload" || echo "make test: copying the images into containerd failed; the real-pod tier copies them" >&2
stage "pytest: e2e (real vLLM, real pods)" -- "${pytest[@]}" -m e2e "$(junit e2e)" || rc=$?
exit "$rc"
