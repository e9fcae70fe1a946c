#!/usr/bin/env bash
# Build the images of images.txt, in its order, from the repository root (`make images`).
#   REGISTRY=<host/path>  put in front of every tag (also the role images' BASE_IMAGE); default: none
#   IMAGES="proxy mooncake"  only these folders (default: all of images.txt)
#   FLAVORS="gpu cpu"     the flavours of the vLLM images (vllm and the role images) to build; the others have one.
#                         gpu-0.34 (the GPU build with vLLM 0.34.0) is built only when named here
#   BUILDER=docker|buildah  default: docker when its engine answers, else buildah (daemonless; installed from
#                         Debian's packages by hack/setup-apt.sh, with podman to run them), which makes the
#                         Python base here too
# With buildah the machine's package-index settings and CA bundle are lent to the RUN steps (bind mounts, never
# in a layer), and the vLLM images use the machine's pip cache (the CPU one finds what setup-e2e downloaded).
# An image is rebuilt only when its inputs (Dockerfile, the sources it copies, its build arguments, its base)
# changed: a stamp per image holds their hash.
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/timeline.sh
prefix=${REGISTRY:+${REGISTRY%/}/}
flavors=${FLAVORS:-gpu cpu}
only=${IMAGES:-}
stamps=.cache/images
mkdir -p "$stamps"

builder=${BUILDER:-}
if [ -z "$builder" ]; then
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then builder=docker; else builder=buildah; fi
fi
python_base=""  # docker: the Dockerfiles' default (the official image); buildah: made here
if [ "$builder" = buildah ]; then
  hack/setup-apt.sh buildah mmdebstrap runc podman
  python_base=localhost/epd/python-base:3.11-bookworm
  images/python-base.sh "$python_base"
fi

image_id() {
  if [ "$builder" = docker ]; then docker image inspect --format '{{.Id}}' "$1"; else buildah inspect --type image --format '{{.FromImageID}}' "$1"; fi
}
image_size() {
  if [ "$builder" = docker ]; then docker image inspect --format '{{.Size}}' "$1"
  else buildah images --noheading --format '{{.Size}}' "$1" | head -n 1; fi
}

# The files a Dockerfile COPYs from the context (not --from a stage), as git sees them, changes included.
copied_sources() {
  awk 'toupper($1) == "COPY" { for (i = 2; i < NF; i++) if ($i !~ /^--/) print $i }' "$1" |
    while read -r src; do git ls-files --cached --others --exclude-standard -- "$src"; done | sort -u
}

# Lent to every RUN step by buildah (read-only bind mounts; nothing of them is committed).
lent=()
for path in /etc/pip.conf /etc/ssl/certs/ca-certificates.crt /etc/apt/sources.list /etc/apt/sources.list.d \
            /etc/apt/apt.conf.d /etc/apt/auth.conf.d; do
  [ -e "$path" ] && lent+=(--volume "$path:$path:ro")
done
pip_cache=${PIP_CACHE_DIR:-$HOME/.cache/pip}

# build FOLDER TAG FLAVOR BASE_IMAGE: a vLLM image's flavour (gpu for gpu-0.34) and version (its tag's, less
# "-cpu") are build args.
build() {
  local folder=$1 tag=$2 flavor=$3 base=$4 file="images/$1/Dockerfile"
  local args=(--file "$file" --tag "$tag")
  [ -n "$python_base" ] && grep -q '^ARG PYTHON_IMAGE=' "$file" && args+=(--build-arg "PYTHON_IMAGE=$python_base")
  grep -q '^ARG BASE_IMAGE=' "$file" && args+=(--build-arg "BASE_IMAGE=$base")
  local flavored=""
  grep -q '^ARG FLAVOR=' "$file" && flavored=1 && args+=(--build-arg "FLAVOR=${flavor%%-*}")
  local version=${tag##*:}
  grep -q '^ARG VLLM_VERSION=' "$file" && args+=(--build-arg "VLLM_VERSION=${version%-cpu}")
  local base_id=""
  [ -n "$base" ] && base_id=$(image_id "$base")
  [ -n "$python_base" ] && base_id+=" $(image_id "$python_base")"
  local want stamp="$stamps/${folder}-${flavor}.stamp"
  want=$( (cat "$file"; copied_sources "$file" | xargs -r sha256sum; echo "$builder ${args[*]} $base_id") |
          sha256sum | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && image_id "$tag" >/dev/null 2>&1; then
    echo "images: $tag is current"
    return 0
  fi
  echo "images: building $tag ($builder${flavored:+, $flavor flavour})"
  local start=$SECONDS began
  began=$(date +%s.%N)
  if [ "$builder" = docker ]; then
    DOCKER_BUILDKIT=1 docker build "${args[@]}" .
  else
    # The stale build goes first: a vLLM image beside its rebuild (and the commit's copy in TMPDIR) would need
    # three times its 6 GB at once.
    buildah rmi "$tag" >/dev/null 2>&1 || true
    local mounts=("${lent[@]}")
    [ -n "$flavored" ] && [ -d "$pip_cache" ] && mounts+=(--volume "$pip_cache:/var/cache/epd-pip")
    # No --layers: buildah 1.28 then skips a cached stage that a later RUN --mount=type=bind,from= needs.
    buildah bud --isolation chroot --no-cache --force-rm "${mounts[@]}" "${args[@]}" . 2>&1 |
      sed -u -e 's/^/    /'
  fi
  echo "$want" > "$stamp"
  echo "images: $tag built in $((SECONDS - start)) s, $(image_size "$tag")"
  timeline_record "image $tag" "$began"
}

rows=$(grep -v -e '^#' -e '^[[:space:]]*$' images/images.txt)
declare -A column=([gpu]=2 [cpu]=3 [gpu-0.34]=4)
declare -A vllm_base=()
for flavor in $flavors; do
  [ -n "${column[$flavor]:-}" ] || { echo "images: FLAVORS names $flavor; known: ${!column[*]}" >&2; exit 1; }
  vllm_base[$flavor]=$prefix$(awk -v c="${column[$flavor]}" '$1 == "vllm" { print $c }' <<<"$rows")
done
while read -r -a row; do
  folder=${row[0]}
  [ -n "$only" ] && ! [[ " $only " == *" $folder "* ]] && continue
  if (( ${#row[@]} < 3 )); then
    build "$folder" "$prefix${row[1]}" gpu ""
    continue
  fi
  for flavor in $flavors; do
    t=$prefix${row[column[$flavor] - 1]}
    base=""
    [ "$folder" = vllm ] || base=${vllm_base[$flavor]}
    build "$folder" "$t" "$flavor" "$base"
  done
done <<<"$rows"
# What a rebuild left behind untagged (the stamps, not buildah's layer cache, decide what is rebuilt).
if [ "$builder" = buildah ]; then buildah rmi --prune >/dev/null 2>&1 || true; fi
