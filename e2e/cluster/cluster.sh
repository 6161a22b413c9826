#!/usr/bin/env bash
# A real Kubernetes control plane for the e2e tests, from the binaries build.sh
# makes: etcd, kube-apiserver (TLS, RBAC, admission on), kube-controller-manager,
# kube-scheduler and kwok (fake nodes that make scheduled pods Running/Ready),
# run as processes by `kwokctl create cluster --runtime binary` with every
# binary flag pointing at the local builds (nothing is downloaded).
#
#   cluster.sh up     build (cached) + start + 2 kwok nodes; prints the kubeconfig path
#   cluster.sh down   stop everything and remove the cluster's state
#   cluster.sh env    print KUBECONFIG=... and PATH for a shell: eval "$(cluster.sh env)"
# Both up and down are idempotent. State lives in $PAGEDKUBE_E2E_DIR
# (default /tmp/pagedkube-e2e-$UID); the cluster is named $PAGEDKUBE_E2E_CLUSTER.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
name="${PAGEDKUBE_E2E_CLUSTER:-pagedkube-e2e}"
state="${PAGEDKUBE_E2E_DIR:-/tmp/pagedkube-e2e-$(id -u)}"
kubeconfig="$state/kubeconfig"
python="${PYTHON:-$root/.venv/bin/python}"
export KWOK_WORKDIR="$state/kwok"

log() { echo "cluster.sh: $*" >&2; }

tools() {
  bin="$("$here/build.sh")"
  kubectl="$("$python" "$root/tests/tools/binaries.py" kubectl)"
  # kwokctl runs `kubectl` from PATH (else it would download one).
  PATH="$bin:$(dirname "$kubectl"):$PATH"
  export PATH
}

healthy() {
  [[ -f "$kubeconfig" ]] && kubectl --kubeconfig "$kubeconfig" --request-timeout 5s get --raw /readyz >/dev/null 2>&1
}

up() {
  tools
  mkdir -p "$state"
  if healthy && kwokctl get clusters 2>/dev/null | grep -qx "$name"; then
    echo "$kubeconfig"
    return
  fi
  kwokctl delete cluster --name "$name" >/dev/null 2>&1 || true
  rm -f "$kubeconfig"
  log "starting cluster $name in $state"
  kwokctl create cluster --name "$name" --runtime binary \
    --kubeconfig "$kubeconfig" \
    --kube-authorization=true --kube-admission=true \
    --etcd-binary "$bin/etcd" \
    --kube-apiserver-binary "$bin/kube-apiserver" \
    --kube-controller-manager-binary "$bin/kube-controller-manager" \
    --kube-scheduler-binary "$bin/kube-scheduler" \
    --kwok-controller-binary "$bin/kwok" \
    --timeout 5m --wait 3m >&2
  kwokctl scale node --name "$name" --replicas 2 >&2
  kubectl --kubeconfig "$kubeconfig" wait --for=condition=Ready node --all --timeout 120s >&2
  echo "$kubeconfig"
}

down() {
  if [[ -d "$KWOK_WORKDIR" ]]; then
    if ! (tools && kwokctl delete cluster --name "$name" >&2); then
      # no kwokctl (or it failed): stop the processes it recorded, by pid
      for f in "$KWOK_WORKDIR/clusters/$name"/pids/*.pid; do
        if [[ -f "$f" ]]; then kill "$(cat "$f")" 2>/dev/null || true; fi
      done
    fi
  fi
  rm -rf "$state"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  env) tools; echo "export KUBECONFIG=$kubeconfig PATH=$PATH" ;;
  *) echo "usage: $0 up|down|env" >&2; exit 2 ;;
esac
