#!/usr/bin/env bash
# Debian packages the tests need, and any named as arguments. Idempotent and quick when everything is present.
#   libibverbs1, libcurl4: every Mooncake binary links libibverbs.so.1 (even with the TCP transport) and libcurl.
#   iproute2:    per-role network namespaces for local runs, and the real node's bridge.
#   containerd, runc, containernetworking-plugins, nftables, iptables: the real node of the local cluster
#                (epd_testenv.realnode; Debian's containerd 1.6 is what kubelet 1.36 takes).
# images/build.sh adds what a daemonless image build and its tests need (buildah, mmdebstrap, runc, podman).
set -euo pipefail
packages=(libibverbs1 libcurl4 iproute2 containerd runc containernetworking-plugins nftables iptables "$@")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "setup-apt: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
