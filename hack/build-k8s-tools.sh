#!/usr/bin/env bash
# Builds the pinned local control plane from the Go modules under tools/k8s/ into BIN_DIR (default .cache/bin):
#   kube     one multi-call binary: kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd,
#            kubelet and kube-proxy (symlinks)
#   kwok     the node and pod simulator
#   helm     the helm client
#   coredns  the real node's cluster DNS (only the plugins it uses)
#   pause    the real node's pod sandbox process
#   prometheus  the dashboard and alert tests' Prometheus (without discovery providers: static targets only)
#   keda/    KEDA's CRDs (ScaledObject and the rest) from its Go module, for the tests' API servers
#   keda-operator, keda-adapter  KEDA itself (its operator and external-metrics API server), for the real-pod
#            autoscaling tests; the slowest group after kube (6 min on an empty build cache), so `make test` builds
#            it apart (BUILD_GROUPS=keda) while the set-up and the tiers, which do not need it, go on
# No package registry ships these servers, so they are built from the official Go modules. A group is rebuilt
# only when its inputs change (its module files, this script, the Go version): a stamp per group holds their
# hash, so a warm run costs a few hashes and prints nothing.
# Build settings follow upstream release builds: static (CGO_ENABLED=0), -trimpath, stripped, tags
# selinux,notest,grpcnotrace, and the version stamped in, or the servers report v0.0.0.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin_dir=${1:-.cache/bin}
groups=${BUILD_GROUPS:-core keda}  # core: every binary but KEDA's
mkdir -p "$bin_dir"
bin_dir=$(cd "$bin_dir" && pwd)
tools="$root/tools/k8s"
source "$root/hack/timeline.sh"

# One build at a time per folder: people share this working tree, and two `make test` runs would otherwise
# race on the same outputs. The second waits, then finds the stamps current and does nothing.
exec 9>"$bin_dir/.lock"
flock 9
tags=selinux,notest,grpcnotrace

command -v go >/dev/null || { echo "build-k8s-tools: Go 1.26 or newer is needed (https://go.dev/dl/)" >&2; exit 1; }
go_version=$(go env GOVERSION)
case "$go_version" in
  go1.2[6-9]* | go1.[3-9][0-9]* | go[2-9]*) ;;
  *) echo "build-k8s-tools: Go 1.26 or newer is needed, found $go_version" >&2; exit 1 ;;
esac

# The version a module pins, read from its go.mod (quicker than asking go, and no network).
pinned() { awk -v m="$2" '$1 == m { print $2; exit }' "$tools/$1/go.mod"; }

# build GROUP OUTPUT PACKAGE LDFLAGS [TAGS]: go build when the group's inputs changed since the last build.
build() {
  local group=$1 out=$2 pkg=$3 ldflags=$4 group_tags=${5:-$tags}
  local stamp="$bin_dir/.stamp-$out" want
  want=$( (cat "$tools/$group"/go.mod "$tools/$group"/go.sum "$tools/$group"/*.go 2>/dev/null
          cat "${BASH_SOURCE[0]}"; echo "$go_version $ldflags $group_tags") | sha256sum | cut -d' ' -f1)
  if [ -x "$bin_dir/$out" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  echo "build-k8s-tools: building $out (several minutes on a cold cache) ..."
  local start=$SECONDS began
  began=$(date +%s.%N)
  (cd "$tools/$group" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -tags "$group_tags" \
    -ldflags "$ldflags" -o "$bin_dir/$out.tmp" "$pkg")
  mv -f "$bin_dir/$out.tmp" "$bin_dir/$out"
  echo "$want" > "$stamp"
  echo "build-k8s-tools: $out built in $((SECONDS - start)) s"
  timeline_record "go build: $out" "$began"
}

if [[ " $groups " == *" core "* ]]; then
  # kube: the servers and kubectl report the Kubernetes release; both version packages are stamped, as upstream
  # does (kubectl's client version comes from client-go's copy).
  kube_version=$(pinned kube k8s.io/kubernetes)
  kube_minor=$(echo "$kube_version" | cut -d. -f2)
  kube_ldflags="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    kube_ldflags+=" -X $p.gitVersion=$kube_version -X $p.gitMajor=1 -X $p.gitMinor=$kube_minor"
    kube_ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  build kube kube . "$kube_ldflags"
  for name in kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kubelet kube-proxy; do
    [ "$(readlink "$bin_dir/$name" 2>/dev/null)" = kube ] || ln -sfn kube "$bin_dir/$name"
  done

  # kwok carries its own version constant; helm's must be stamped or it reports only the minor.
  build kwok kwok sigs.k8s.io/kwok/cmd/kwok "-s -w"
  helm_version=$(pinned helm helm.sh/helm/v4)
  build helm helm helm.sh/helm/v4/cmd/helm \
    "-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
  build coredns coredns . "-s -w"
  # Prometheus for the dashboard and alert tests: static targets only, so no discovery providers.
  prometheus_version=$(pinned prometheus github.com/prometheus/prometheus)
  build prometheus prometheus github.com/prometheus/prometheus/cmd/prometheus \
    "-s -w -X github.com/prometheus/common/version.Version=$prometheus_version" "$tags,remove_all_sd"
  build pause pause . "-s -w"

  # KEDA's CRDs, as its release ships them (config/crd/bases of the module): the control plane serves the
  # ScaledObject kind, so the operator's rendered ScaledObjects are checked against KEDA's own schema.
  keda_version=$(pinned keda github.com/kedacore/keda/v2)
  keda_crds="$keda_version, every CRD"  # the eventing.keda.sh ones too: KEDA's operator watches them all
  if [ ! -f "$bin_dir/keda/.version" ] || [ "$(cat "$bin_dir/keda/.version")" != "$keda_crds" ]; then
    began=$(date +%s.%N)
    keda_dir=$(GOFLAGS=-mod=mod go mod download -json "github.com/kedacore/keda/v2@$keda_version" \
      | awk -F'"' '$2 == "Dir" { print $4 }')
    rm -rf "$bin_dir/keda" && mkdir -p "$bin_dir/keda"
    cp "$keda_dir"/config/crd/bases/*.yaml "$bin_dir/keda/"
    echo "$keda_crds" > "$bin_dir/keda/.version"
    echo "build-k8s-tools: KEDA $keda_version CRDs copied"
    timeline_record "KEDA CRDs" "$began"
  fi
fi

# KEDA's release build: its version stamped into the welcome line and the /metrics build info.
if [[ " $groups " == *" keda "* ]]; then
  keda_version=$(pinned keda github.com/kedacore/keda/v2)
  keda_ldflags="-s -w -X github.com/kedacore/keda/v2/version.Version=$keda_version"
  build keda keda-operator github.com/kedacore/keda/v2/cmd/operator "$keda_ldflags"
  build keda keda-adapter github.com/kedacore/keda/v2/cmd/adapter "$keda_ldflags"
fi
