#!/usr/bin/env bash
# Build every image of images.txt, in its order, from the repository root (`make images`).
#   REGISTRY=<host/path>  put in front of every tag (also the role images' BASE_IMAGE); default: none
#   REQUIRE_DOCKER=1      fail, instead of only saying so, when no Docker engine answers
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then
  echo "images: no Docker engine answers here (docker info failed): nothing was built." >&2
  echo "images: the Dockerfiles are checked without building by tests/unit/packaging/test_images.py." >&2
  [ "${REQUIRE_DOCKER:-0}" = "1" ] && exit 1
  exit 0
fi
prefix=${REGISTRY:+${REGISTRY%/}/}
base=""
while read -r folder tag; do
  case "$folder" in ''|'#'*) continue ;; esac
  args=(--file "images/$folder/Dockerfile" --tag "$prefix$tag")
  [ "$folder" = vllm ] && base="$prefix$tag"
  if grep -q '^ARG BASE_IMAGE=' "images/$folder/Dockerfile"; then
    args+=(--build-arg "BASE_IMAGE=$base")
  fi
  echo "images: building $prefix$tag"
  DOCKER_BUILDKIT=1 docker build "${args[@]}" .
done < images/images.txt
