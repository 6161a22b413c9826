#!/usr/bin/env bash
# Build the e2e cluster's binaries once per machine, cached by version:
#   ${XDG_CACHE_HOME:-~/.cache}/pagedkube/e2e/<K8S_VERSION>/bin/
#     kube-apiserver kube-controller-manager kube-scheduler  (k8s.io/kubernetes)
#     kwok kwokctl                                           (sigs.k8s.io/kwok)
#     etcd                                                   (go.etcd.io/etcd/server/v3)
#     actionlint                                             (github.com/rhysd/actionlint)
#   build.sh node: also kubelet kube-proxy (k8s.io/kubernetes) and containerd,
#   containerd-shim-runc-v2, ctr (github.com/containerd/containerd/v2) for the real
#   node (node.sh), with its own stamp so the control plane's cache stays valid.
# Each group is built from a small generated wrapper module with one
# `go build -o DIR ...` so the packages compile once; a stamp file records the
# versions so a second run skips the build. Prints the bin dir on stdout.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env source-path=SCRIPTDIR
source "$here/versions.env"

cache="${XDG_CACHE_HOME:-$HOME/.cache}/pagedkube/e2e/$K8S_VERSION"
bin="$cache/bin"
src="$cache/src"
stamp="$bin/.stamp"
want="k8s=$K8S_VERSION kwok=$KWOK_VERSION etcd=$ETCD_VERSION actionlint=$ACTIONLINT_VERSION"

want_node="k8s=$K8S_VERSION kubelet kube-proxy containerd=$CONTAINERD_VERSION"
node_stamp="$bin/.stamp-node"
want_addons="lws=$LWS_VERSION coredns=$COREDNS_VERSION"
addons_stamp="$bin/.stamp-addons"
stale() { [[ ! ( -f "$1" && "$(cat "$1")" == "$2" ) ]]; }
need_node=0 need_addons=0
if [[ "${1:-}" == node ]]; then
  if stale "$node_stamp" "$want_node"; then need_node=1; fi
  if stale "$addons_stamp" "$want_addons"; then need_addons=1; fi
fi
if ! stale "$stamp" "$want" && [[ $need_node == 0 && $need_addons == 0 ]]; then
  echo "$bin"
  exit 0
fi
command -v go >/dev/null || { echo "build.sh: no 'go' on PATH" >&2; exit 3; }
mkdir -p "$bin" "$src"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
log() { echo "build.sh: [$SECONDS s] $*" >&2; }

# k8s_module DIR NAME PACKAGE...: a wrapper module pagedkube.io/e2e/NAME that imports the
# k8s.io/kubernetes PACKAGEs, with every staging module k8s.io/kubernetes points at
# ./staging/... replaced by the published v0.<minor>.<patch>. The control plane's and the
# node's modules are made the same way, so they resolve the same versions and share the
# module and build caches.
k8s_module() {
  local d="$1" name="$2" minor="v0.${K8S_VERSION#v1.}" gomod pkg
  shift 2
  mkdir -p "$d"
  gomod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')"
  {
    printf 'module pagedkube.io/e2e/%s\n\ngo 1.25.0\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$name" "$K8S_VERSION"
    sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => \./staging/.*#\t\1 => \1 '"$minor"'#p' "$gomod"
    printf ')\n'
  } > "$d/go.mod"
  {
    printf '//go:build tools\n\npackage %s\n\nimport (\n' "$name"
    for pkg in "$@"; do printf '\t_ "k8s.io/kubernetes/cmd/%s/app"\n' "$pkg"; done
    printf ')\n'
  } > "$d/tools.go"
  (cd "$d" && go mod tidy -e >&2)
}

# build_k8s_bins DIR NAME CMD...: k8s_module, then one `go build` of the commands.
build_k8s_bins() {
  local d="$1" name="$2" cmd pkgs=()
  shift 2
  k8s_module "$d" "$name" "$@"
  for cmd in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$cmd"); done
  log "building $* $K8S_VERSION"
  (cd "$d" && go build -o "$bin/" -ldflags "$(k8s_ldflags)" "${pkgs[@]}")
}

build_k8s() { build_k8s_bins "$src/k8s" k8sbins kube-apiserver kube-controller-manager kube-scheduler; }

# kubelet and kube-proxy for the real node (node.sh).
build_node() { build_k8s_bins "$src/k8snode" k8snode kubelet kube-proxy; }

# containerd v2, its runc shim and ctr for the real node, static (CGO off: no btrfs, which
# the node does not use) with the tags of containerd's own release builds.
build_containerd() {
  local mod=github.com/containerd/containerd/v2 cmd pkgs=()
  for cmd in containerd containerd-shim-runc-v2 ctr; do pkgs+=("$mod/cmd/$cmd@$CONTAINERD_VERSION"); done
  log "building containerd containerd-shim-runc-v2 ctr $CONTAINERD_VERSION"
  CGO_ENABLED=0 GOBIN="$bin" go install -trimpath -tags "urfave_cli_no_docs osusergo netgo static_build" \
    -ldflags "-s -w -X $mod/version.Version=$CONTAINERD_VERSION -X $mod/version.Package=$mod" "${pkgs[@]}"
}

k8s_ldflags() {
  local ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
  ld+=" -X k8s.io/component-base/version.gitMajor=1"
  ld+=" -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
  ld+=" -X k8s.io/component-base/version.gitTreeState=clean"
  ld+=" -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
  echo "$ld"
}

build_kwok() {
  local d="$src/kwok"
  mkdir -p "$d"
  printf 'module pagedkube.io/e2e/kwokbins\n\ngo 1.25.0\n\nrequire sigs.k8s.io/kwok %s\n' "$KWOK_VERSION" > "$d/go.mod"
  cat > "$d/tools.go" <<'GO'
//go:build tools

package kwokbins

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
	_ "sigs.k8s.io/kwok/cmd/kwokctl"
)
GO
  (cd "$d" && go mod tidy -e >&2)
  log "building kwok kwokctl $KWOK_VERSION"
  (cd "$d" && go build -trimpath -o "$bin/" \
    -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v} -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${K8S_VERSION#v}" \
    sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl)
}

build_etcd() {
  local d="$src/etcd"
  mkdir -p "$d"
  printf 'module pagedkube.io/e2e/etcdbin\n\ngo 1.25.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > "$d/go.mod"
  cat > "$d/main.go" <<'GO'
// etcd: the upstream server entry point, built from go.etcd.io/etcd/server/v3.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  (cd "$d" && go mod tidy -e >&2)
  log "building etcd $ETCD_VERSION"
  (cd "$d" && go build -trimpath -o "$bin/etcd" -ldflags "-s -w" .)
}

build_actionlint() {
  log "building actionlint $ACTIONLINT_VERSION"
  GOBIN="$bin" go install -trimpath -ldflags "-s -w" "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION"
}

# The LeaderWorkerSet controller: LWS's own main (cmd/), built in a copy of its module with
# the module's go.mod and go.sum (`go install pkg@version` would ask the proxy for the module's
# version list, which it refuses here), and its CRD copied beside it for cluster.sh.
build_lws() {
  local d="$src/lws" dir
  dir="$(go mod download -json "sigs.k8s.io/lws@$LWS_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",\?$/\1/p')"
  rm -rf "$d" && cp -r "$dir" "$d" && chmod -R u+w "$d"
  log "building lws-controller $LWS_VERSION"
  (cd "$d" && go build -trimpath -o "$bin/lws-controller" \
    -ldflags "-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=$LWS_VERSION" ./cmd)
  install -m 644 "$d/config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml" "$bin/lws-crd.yaml"
}

# CoreDNS with the plugins node.sh's Corefile names, in the order of CoreDNS's plugin.cfg
# (the order requests pass through them), from a main of ours: CoreDNS's own main links
# every plugin (cloud DNS providers included).
build_coredns() {
  local d="$src/coredns" plugin
  local plugins=(bind errors cache kubernetes forward)
  mkdir -p "$d"
  printf 'module pagedkube.io/e2e/corednsbin\n\ngo 1.24.0\n\nrequire github.com/coredns/coredns %s\n' \
    "$COREDNS_VERSION" > "$d/go.mod"
  {
    printf '// coredns: CoreDNS %s with only the plugins the e2e node needs.\npackage main\n\nimport (\n' "$COREDNS_VERSION"
    printf '\t"github.com/coredns/coredns/core/dnsserver"\n\t"github.com/coredns/coredns/coremain"\n'
    for plugin in "${plugins[@]}"; do printf '\t_ "github.com/coredns/coredns/plugin/%s"\n' "$plugin"; done
    printf ')\n\nfunc init() { dnsserver.Directives = []string{'
    printf '"%s", ' "${plugins[@]}"
    printf '} }\n\nfunc main() { coremain.Run() }\n'
  } > "$d/main.go"
  (cd "$d" && go mod tidy -e >&2)
  log "building coredns $COREDNS_VERSION"
  (cd "$d" && go build -trimpath -o "$bin/coredns" -ldflags "-s -w" .)
}

start=$(date +%s)
if stale "$stamp" "$want"; then
  build_actionlint
  build_kwok
  build_etcd
  build_k8s
  log "built in $(( $(date +%s) - start )) s"
  echo "$want" > "$stamp"
fi
if [[ $need_node == 1 ]]; then
  build_node
  build_containerd
  log "node binaries built in $(( $(date +%s) - start )) s"
  echo "$want_node" > "$node_stamp"
fi
if [[ $need_addons == 1 ]]; then
  build_lws
  build_coredns
  log "node add-ons built in $(( $(date +%s) - start )) s"
  echo "$want_addons" > "$addons_stamp"
fi
echo "$bin"
