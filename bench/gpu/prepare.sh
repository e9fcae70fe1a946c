#!/usr/bin/env bash
# bench/gpu/prepare.sh [OUT]: everything the GPU run needs, made on a CPU machine (docs/gpu.md says how to use it).
#
# The lent H200 reaches no package registry and takes at most 64 MiB of working tree per call, so this
#   1. downloads the wheels of wheels-vllm-0.26.txt (CPython 3.12, manylinux x86_64, --no-deps),
#   2. installs them into a staging site-packages and leaves out what this run never loads (vLLM's FlashAttention 2
#      and MoE kernels and its Rust front end; Mooncake's process-group, expert-parallel and bench binaries),
#   3. adds the shared libraries Mooncake's binaries link (libibverbs, libmlx5, libnuma, libcurl and its
#      dependencies) from Debian packages; the run uses each only where the machine lacks that library,
#   4. builds the epd-connectors wheel from this checkout (its vLLM plugins and the epd-launch/epd-proxy commands),
#   5. packs two xz archives, split into parts that each fit one call with room for the working tree:
#        OUT/parts/a.NN  vLLM and its dependencies  (the first calls: run_gpu.sh stash, then unpack-a)
#        OUT/parts/b.NN  Mooncake, FlashInfer, the shared libraries (the last call, with the connectors wheel)
#      and OUT/SHA256SUMS.
# OUT defaults to .run/gpu (ignored by git; name its files in the device tool's `carry`). Downloads are kept in
# OUT/downloads, so a second run only repacks. Runs niced and single-threaded (EPD_GPU_XZ_THREADS to change).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=$(mkdir -p "${1:-$REPO/.run/gpu}" && cd "${1:-$REPO/.run/gpu}" && pwd)
PART_MIB=${EPD_GPU_PART_MIB:-55}
XZ_THREADS=${EPD_GPU_XZ_THREADS:-1}
PY=${PYTHON:-python3}
DL=$OUT/downloads
STAGE=$OUT/stage
PLATFORMS=(manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64
  manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64
  manylinux1_x86_64)
PLATFORM_ARGS=()
for p in "${PLATFORMS[@]}"; do PLATFORM_ARGS+=(--platform "$p"); done
TARGET_ARGS=(--only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORM_ARGS[@]}")
DEBS=(libibverbs1 ibverbs-providers libnuma1 libcurl4 libnghttp2-14 librtmp1 libssh2-1 libpsl5 libbrotli1
  libldap-2.5-0 libsasl2-2 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libzstd1 libidn2-0
  libunistring2 libssl3 libgnutls30 libhogweed6 libnettle8 libgmp10 libp11-kit0 libtasn1-6 libffi8
  libsasl2-modules-db libdb5.3 libcom-err2)
say() { echo "prepare: $*" >&2; }

mkdir -p "$DL/wheels" "$DL/deb" "$OUT/parts"
say "1/5 wheels of $(basename "$HERE")/wheels-vllm-0.26.txt -> $DL/wheels"
nice -n 19 "$PY" -m pip download -q --no-deps "${TARGET_ARGS[@]}" -d "$DL/wheels" -r "$HERE/wheels-vllm-0.26.txt"

say "2/5 staging site-packages"
rm -rf "$STAGE" && mkdir -p "$STAGE/a" "$STAGE/b"
mapfile -t pins < <(grep -vE '^\s*(#|$)' "$HERE/wheels-vllm-0.26.txt")
wheels=()
for pin in "${pins[@]}"; do
  name=${pin%%==*} version=${pin#*==}
  file=$(ls "$DL/wheels/" | grep -iE "^${name//-/[-_]}-${version}-" | head -n 1 || true)
  [ -n "$file" ] || { say "no wheel for $pin in $DL/wheels"; exit 1; }
  wheels+=("$DL/wheels/$file")
done
nice -n 19 "$PY" -m pip install -q --no-deps --no-compile --target "$STAGE/a/site" "${TARGET_ARGS[@]}" "${wheels[@]}"
site=$STAGE/a/site
rm -f "$site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" "$site/vllm/_moe_C_stable_libtorch.abi3.so" "$site/vllm/vllm-rs"
rm -f "$site"/vllm/third_party/deep_gemm/_C.cpython-31[0134]-*.so
rm -f "$site"/mooncake/_ep.*.so "$site"/mooncake/libmooncake_pg*.so "$site"/mooncake/libmooncake_ep_device.so \
  "$site"/mooncake/transfer_engine_bench
find "$site" -name __pycache__ -type d -prune -exec rm -rf {} +
# Console scripts written here name this machine's interpreter; the GPU machine's is its python3.
for script in "$site"/bin/*; do
  if head -c 2 "$script" | grep -q '#!'; then sed -i '1s|^#!.*python.*$|#!/usr/bin/env python3|' "$script"; fi
done
# Archive b: Mooncake (its package, its bundled libraries, its console scripts) and FlashInfer, which change
# apart from vLLM; archive a: the rest.
mkdir -p "$STAGE/b/site/bin"
for entry in "$site"/mooncake* "$site"/flashinfer*; do mv "$entry" "$STAGE/b/site/"; done
for script in mooncake_master mooncake_client mooncake_http_metadata_server mc_store_rest_server \
  transfer_engine_bench transfer_engine_topology_dump; do
  [ -e "$site/bin/$script" ] && mv "$site/bin/$script" "$STAGE/b/site/bin/"
done

say "3/5 shared libraries for Mooncake's binaries (Debian packages)"
(cd "$DL/deb" && nice -n 19 apt-get download -qq "${DEBS[@]}" 2>/dev/null) ||
  say "apt-get download failed (run apt-get update first); Mooncake will need the machine's own libraries"
mkdir -p "$STAGE/b/syslibs" "$STAGE/debs"
for deb in "$DL"/deb/*.deb; do [ -e "$deb" ] && dpkg-deb -x "$deb" "$STAGE/debs"; done
for dir in "$STAGE"/debs/usr/lib/x86_64-linux-gnu "$STAGE"/debs/lib/x86_64-linux-gnu; do
  [ -d "$dir" ] && find "$dir" -maxdepth 1 -name '*.so.*' -exec cp -a {} "$STAGE/b/syslibs/" \;
done
rm -rf "$STAGE/debs"

say "4/5 the epd-connectors wheel from this checkout"
src=$(mktemp -d)
(cd "$REPO" && git ls-files -z connectors | xargs -0 tar -cf - | tar -xf - -C "$src")
rm -f "$OUT"/epd_connectors-*.whl
nice -n 19 "$PY" -m pip wheel -q --no-deps -w "$OUT" "$src/connectors"
rm -rf "$src"

say "5/5 archives (xz -9, $XZ_THREADS thread(s)) split into ${PART_MIB} MiB parts"
rm -f "$OUT"/parts/*
for name in a b; do
  tar -C "$STAGE/$name" -cf - . | nice -n 19 xz -9 -T"$XZ_THREADS" -c | split -b "${PART_MIB}M" -d -a 2 - "$OUT/parts/$name."
done
(cd "$OUT" && sha256sum parts/* epd_connectors-*.whl > SHA256SUMS)
du -sh "$STAGE/a" "$STAGE/b" >&2
ls -l "$OUT/parts" "$OUT"/epd_connectors-*.whl >&2
say "done: run_gpu.sh stash with a.00, unpack-a with a.01, run with b.00 and the wheel (docs/gpu.md)"
