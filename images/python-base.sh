#!/usr/bin/env bash
# The Dockerfiles' Python base made here from Debian's packages, for machines that reach no image registry:
# a Debian bookworm minbase with python3, its C headers and ca-certificates (mmdebstrap), and a venv over
# /usr/local, so python and pip are in /usr/local/bin as in the official python:3.11-slim, which has the headers
# too (torch inductor compiles against Python.h at run time; vLLM's sampler uses it on the CPU). Its apt sources are Debian's public ones, as
# in that image: the machine's own package-index settings are lent to RUN steps by build.sh, never kept.
#   images/python-base.sh TAG   build TAG with buildah (only when this script changed; a stamp holds its hash)
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:?usage: images/python-base.sh TAG}
stamps=.cache/images
mkdir -p "$stamps"
want=$( (cat "$0"; echo "$tag") | sha256sum | cut -d' ' -f1)
stamp="$stamps/python-base.stamp"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && buildah inspect --type image "$tag" >/dev/null 2>&1; then
  exit 0
fi
echo "images: making the Python base $tag from Debian's packages (mmdebstrap, about a minute)"
start=$SECONDS
began=$(date +%s.%N)
work=$(mktemp -d)
container=""
cleanup() {
  [ -n "$container" ] && buildah rm "$container" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
# The host's apt sources fetch the packages; the rootfs keeps Debian's public sources instead.
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,libpython3.11-dev,ca-certificates \
  --customize-hook='rm -f "$1"/etc/apt/sources.list "$1"/etc/apt/sources.list.d/*' \
  --customize-hook='printf "%s\n" "Types: deb" "URIs: http://deb.debian.org/debian" \
      "Suites: bookworm bookworm-updates" "Components: main" \
      "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" "" "Types: deb" \
      "URIs: http://deb.debian.org/debian-security" "Suites: bookworm-security" "Components: main" \
      "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" > "$1"/etc/apt/sources.list.d/debian.sources' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
  bookworm "$work/rootfs.tar"
container=$(buildah from scratch)
buildah add --quiet "$container" "$work/rootfs.tar" / >/dev/null
buildah run --isolation chroot "$container" -- python3 -m venv /usr/local
buildah run --isolation chroot "$container" -- rm -rf /root/.cache
buildah config --env LANG=C.UTF-8 --env PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin \
  --cmd python3 --label org.opencontainers.image.title=epd-python-base \
  --label "org.opencontainers.image.description=Debian bookworm minbase, python3 with a venv over /usr/local" \
  "$container"
buildah commit --quiet --rm "$container" "$tag" >/dev/null
container=""
echo "$want" > "$stamp"
echo "images: $tag made in $((SECONDS - start)) s"
source hack/timeline.sh
timeline_record "image $tag (Debian's packages)" "$began"
