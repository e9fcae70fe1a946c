#!/usr/bin/env bash
# Pins every module that kwok's (or helm's) build shares with the kube module to kube's version, by replace
# directives in tools/k8s/GROUP/go.mod. Why: Go reuses a compiled package only when the package and all its
# dependencies are the same versions, so aligned modules compile k8s.io/api, client-go, apimachinery, grpc, otel
# and the rest once for all three binaries instead of three times: minutes saved on every cold build.
# The kube module itself is never changed (its versions are the Kubernetes release's own).
# Run after changing a pinned version: tools/k8s/align.sh kwok helm; then rebuild and run the cluster tests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

kube_list=$(cd kube && go list -m -f '{{.Path}} {{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}' all)

for group in "$@"; do
  (
    cd "$group"
    # Start from the group's own requirements, then add one replace per differing shared module.
    go mod edit -json | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    print(r["Old"]["Path"])
' | while read -r old; do go mod edit -dropreplace="$old"; done
    go mod tidy -e  # -e: test-only imports of dependencies may not resolve at older versions; builds need none
    own_list=$(go list -m -f '{{.Path}} {{.Version}}' all)
    count=0
    while read -r path version; do
      kube_version=$(awk -v p="$path" '$1 == p { print $2 }' <<<"$kube_list")
      if [ -n "$kube_version" ] && [ -n "$version" ] && [ "$kube_version" != "$version" ]; then
        go mod edit -replace="$path=$path@$kube_version"
        count=$((count + 1))
      fi
    done <<<"$own_list"
    go mod tidy -e  # -e: test-only imports of dependencies may not resolve at older versions; builds need none
    echo "align: $group: $count modules pinned to the kube module's versions"
  )
done
