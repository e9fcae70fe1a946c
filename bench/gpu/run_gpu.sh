#!/usr/bin/env bash
# bench/gpu/run_gpu.sh STEP: the GPU machine's side of bench/gpu (docs/gpu.md). Run from the repository root.
#
# The files bench/gpu/prepare.sh made travel in parts, one call each, under $EPD_GPU_CARRY (default .run/gpu:
# parts/a.NN, parts/b.NN, epd_connectors-*.whl, SHA256SUMS). The machine keeps /tmp while it stays warm (30 s
# after a call), so each call stashes what it brought in /tmp/epd-gpu/chunks and the next one starts at once.
#   stash      copy this call's parts to /tmp/epd-gpu/chunks; print the machine (GPU, driver, torch); build the
#              tiny model (tools/tinymodel, with the machine's torch and transformers)
#   unpack-a   stash; unpack archive a (vLLM and its dependencies) once it is whole; import vLLM once (its
#              first import is slow)
#   run        stash; unpack what is not yet unpacked; install the connectors wheel; then gpu_bench.py (PHASES,
#              default "correctness timing"); results in $OUT (results.json, summary, logs.tar.gz)
set -uo pipefail
STEP=${1:-run}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(pwd)
CARRY=${EPD_GPU_CARRY:-.run/gpu}
ROOT=/tmp/epd-gpu
OUT=${OUT:-$ROOT/out}
mkdir -p "$ROOT/chunks" "$OUT"
exec > >(tee -a "$OUT/setup.log") 2>&1
t0=$(date +%s)
say() { echo "[run_gpu +$(( $(date +%s) - t0 ))s] $*"; }

stash() {
  [ -d "$CARRY/parts" ] && cp -n "$CARRY"/parts/* "$ROOT/chunks/" 2>/dev/null
  [ -f "$CARRY/SHA256SUMS" ] && cp "$CARRY/SHA256SUMS" "$ROOT/chunks/SHA256SUMS"
  ls "$CARRY"/epd_connectors-*.whl >/dev/null 2>&1 && cp "$CARRY"/epd_connectors-*.whl "$ROOT/chunks/"
  say "chunks: $(cd "$ROOT/chunks" && ls | tr '\n' ' ')"
}

machine() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
  nproc; free -g | head -2; df -h /tmp | tail -n 1
  for lib in libibverbs.so.1 libmlx5.so.1 libnuma.so.1 libcurl.so.4; do
    ldconfig -p | grep -q "^[[:space:]]*$lib " && echo "$lib: the machine's" || echo "$lib: missing (carried)"
  done
}

# unpack NAME: archive NAME (a or b) into $ROOT once every part listed in SHA256SUMS is here and verified.
unpack() {
  local name=$1
  [ -f "$ROOT/.unpacked-$name" ] && return 0
  local want have
  want=$(grep -c " parts/$name\." "$ROOT/chunks/SHA256SUMS" 2>/dev/null || echo 0)
  have=$(ls "$ROOT"/chunks/"$name".* 2>/dev/null | wc -l)
  if [ "$want" = 0 ] || [ "$have" != "$want" ]; then say "archive $name: $have of $want parts here"; return 1; fi
  if ! (cd "$ROOT/chunks" && sed "s| parts/| |" SHA256SUMS | grep " $name\." | sha256sum -c --quiet); then
    say "archive $name: checksum mismatch"; return 1
  fi
  cat "$ROOT"/chunks/"$name".* | xz -d -T0 | tar -x -C "$ROOT" && touch "$ROOT/.unpacked-$name"
  rm -f "$ROOT"/chunks/"$name".*
  say "archive $name unpacked: $(du -sh "$ROOT/site" | cut -f1) in $ROOT/site"
}

environment() {
  export PYTHONPATH=$ROOT/epd:$ROOT/site:$REPO/operator/src:$REPO/tools/local/src
  export PATH=$ROOT/epd/bin:$ROOT/site/bin:$PATH
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1
  # Mooncake's binaries link libcudart.so.13 (torch's, from its nvidia wheel) and system libraries the image
  # may lack; a carried library is used only where the machine has none of that name.
  local cudart
  cudart=$(python3 -c 'import glob, os, site; print(":".join(sorted({os.path.dirname(p) for d in site.getsitepackages() for p in glob.glob(d + "/nvidia/**/libcudart.so.*", recursive=True)})))' 2>/dev/null)
  mkdir -p "$ROOT/syslibs-used"
  if [ -d "$ROOT/syslibs" ]; then
    for lib in "$ROOT"/syslibs/*.so.*; do
      local soname
      soname=$(basename "$lib")
      ldconfig -p | grep -q "^[[:space:]]*$soname " || cp -L "$lib" "$ROOT/syslibs-used/$soname" 2>/dev/null
    done
  fi
  export LD_LIBRARY_PATH=${cudart}:$ROOT/syslibs-used${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}

tiny_model() {
  [ -f "$ROOT/model/config.json" ] && return 0
  python3 tools/tinymodel/make_tiny_qwen2vl.py --out "$ROOT/model" --quiet >/dev/null && say "tiny model built"
}

case $STEP in
  stash)
    stash; machine; tiny_model
    ;;
  unpack-a)
    stash; unpack a || exit 1
    environment; tiny_model
    python3 -c 'import time; t = time.time(); import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__, torch.cuda.get_device_name(), f"import {time.time() - t:.1f}s")'
    ;;
  run)
    stash; unpack a || exit 1; unpack b || exit 1
    environment
    if [ ! -f "$ROOT/.installed-epd" ]; then
      rm -rf "$ROOT/epd"
      python3 -m pip install -q --no-deps --no-index --no-compile --target "$ROOT/epd" "$ROOT"/chunks/epd_connectors-*.whl \
        && touch "$ROOT/.installed-epd"
    fi
    say "carried system libraries in use: $(ls "$ROOT/syslibs-used" | tr '\n' ' ')"
    for bin in mooncake_master mooncake_client; do
      missing=$(ldd "$ROOT/site/mooncake/$bin" | grep "not found")
      say "$bin: ${missing:-every library found}"
    done
    tiny_model
    python3 -c 'import vllm, mooncake.engine, epd_connectors, epd_local; print("vllm", vllm.__version__)' || exit 1
    # shellcheck disable=SC2086 # PHASES is a word list
    python3 "$HERE/gpu_bench.py" ${PHASES:-correctness timing} --model "$ROOT/model" --workdir "$ROOT/work" \
      --out "$OUT" ${GPU_BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
    python3 "$HERE/summary.py" "$OUT/results.json" > "$OUT/summary.md" && cat "$OUT/summary.md"
    ;;
  *)
    echo "usage: run_gpu.sh stash|unpack-a|run" >&2; exit 2
    ;;
esac
say "step $STEP done"
