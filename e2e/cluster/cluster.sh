#!/usr/bin/env bash
# A real Kubernetes control plane for the e2e tests, from the binaries build.sh
# makes: etcd, kube-apiserver (TLS, RBAC, admission on), kube-controller-manager,
# kube-scheduler and kwok (fake nodes that make scheduled pods Running/Ready),
# run as processes by `kwokctl create cluster --runtime binary` with every
# binary flag pointing at the local builds (nothing is downloaded).
#
#   cluster.sh up     build (cached) + start + 2 kwok nodes; prints the kubeconfig path
#   cluster.sh down   stop everything and remove the cluster's state
#   cluster.sh env    print KUBECONFIG=... and PATH (kubectl, kwokctl, helm) for a shell: eval "$(cluster.sh env)"
# Both up and down are idempotent. State lives in $PAGEDKUBE_E2E_DIR
# (default /tmp/pagedkube-e2e-$UID); the cluster is named $PAGEDKUBE_E2E_CLUSTER.
#
# PAGEDKUBE_E2E_NODE=real adds a real node (node.sh: kubelet, kube-proxy,
# containerd, runc, CNI bridge) that runs pods for real from the images
# images.sh builds, with CoreDNS as the pods' DNS, and the LeaderWorkerSet controller
# (lws.sh: CRD, controller, webhooks); the kwok nodes stay, tainted kwok.x-k8s.io/node=fake:NoSchedule
# so only pods that tolerate fakes land there. Its defaults: cluster pagedkube-node,
# state /tmp/pagedkube-node-$UID (so it never collides with the kwok-only cluster).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
mode="${PAGEDKUBE_E2E_NODE:-kwok}"
case "$mode" in
  kwok) name="${PAGEDKUBE_E2E_CLUSTER:-pagedkube-e2e}"; state="${PAGEDKUBE_E2E_DIR:-/tmp/pagedkube-e2e-$(id -u)}" ;;
  real) name="${PAGEDKUBE_E2E_CLUSTER:-pagedkube-node}"; state="${PAGEDKUBE_E2E_DIR:-/tmp/pagedkube-node-$(id -u)}" ;;
  *) echo "cluster.sh: PAGEDKUBE_E2E_NODE must be kwok or real, not '$mode'" >&2; exit 2 ;;
esac
kubeconfig="$state/kubeconfig"
python="${PYTHON:-$root/.venv/bin/python}"
export KWOK_WORKDIR="$state/kwok"

log() { echo "cluster.sh: $*" >&2; }

tools() {
  if [[ "$mode" == real ]]; then bin="$("$here/build.sh" node)"; else bin="$("$here/build.sh")"; fi
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
  if healthy && kwokctl get clusters 2>/dev/null | grep -x "$name" >/dev/null; then
    if [[ "$mode" == real ]]; then real_node; fi
    echo "$kubeconfig"
    return
  fi
  if [[ "$mode" == real ]]; then "$here/node.sh" down "$state" "$bin"; fi
  kwokctl delete cluster --name "$name" >/dev/null 2>&1 || true
  rm -f "$kubeconfig"
  log "starting cluster $name in $state"
  local config=()
  if [[ "$mode" == real ]]; then config=(--config "$(real_node_kwokctl_config)"); fi
  kwokctl create cluster --name "$name" --runtime binary "${config[@]}" \
    --kubeconfig "$kubeconfig" \
    --kube-authorization=true --kube-admission=true \
    --etcd-binary "$bin/etcd" \
    --kube-apiserver-binary "$bin/kube-apiserver" \
    --kube-controller-manager-binary "$bin/kube-controller-manager" \
    --kube-scheduler-binary "$bin/kube-scheduler" \
    --kwok-controller-binary "$bin/kwok" \
    --timeout 5m --wait 3m >&2
  kwokctl scale node --name "$name" --replicas 2 >&2
  controllers
  if [[ "$mode" == real ]]; then
    kubectl --kubeconfig "$kubeconfig" taint nodes -l type=kwok kwok.x-k8s.io/node=fake:NoSchedule --overwrite >&2
    real_node
  fi
  kubectl --kubeconfig "$kubeconfig" wait --for=condition=Ready node --all --timeout 120s >&2
  echo "$kubeconfig"
}

pki() { echo "$KWOK_WORKDIR/clusters/$name/pki"; }

# The controller-manager's controllers run: namespace default has its ServiceAccount. A CI run
# once had none for its whole session (no ServiceAccounts, no ReplicaSet's pods, every test
# failing at a 5-minute wait); this says so at once, with the controller-manager's log.
controllers() {
  for _ in $(seq 120); do
    if kubectl --kubeconfig "$kubeconfig" -n default get serviceaccount default >/dev/null 2>&1; then return; fi
    sleep 1
  done
  log "no ServiceAccount in namespace default 120 s after start: the controller-manager's log ends"
  tail -n 80 "$KWOK_WORKDIR/clusters/$name/logs/kube-controller-manager.log" >&2 || true
  return 1
}

# kwokctl's options for a cluster with a real node: the kwok controller keeps to
# the nodes annotated as fakes (by default it also fakes the status of the real
# node's pods), the API server reaches the kubelet at its InternalIP with a client
# certificate (logs, exec, port-forward), and its serving certificate also names
# the `kubernetes` Service's ClusterIP, which pods dial.
real_node_kwokctl_config() {
  local f="$state/kwokctl-real-node.yaml" ip
  ip="$(ip -4 route get 1.1.1.1 | sed -n 's/.* src \([0-9.]*\).*/\1/p')"
  cat > "$f" <<EOF
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  kubeApiserverCertSANs: ["10.0.0.1", "$ip"]
componentsPatches:
- name: kwok-controller
  extraArgs:
  - {key: manage-all-nodes, value: "false", override: true}
  - {key: manage-nodes-with-annotation-selector, value: "kwok.x-k8s.io/node=fake"}
- name: kube-apiserver
  extraArgs:
  - {key: kubelet-client-certificate, value: "$(pki)/admin.crt"}
  - {key: kubelet-client-key, value: "$(pki)/admin.key"}
  - {key: kubelet-preferred-address-types, value: "InternalIP,Hostname"}
EOF
  echo "$f"
}

# The real node joins (node.sh up is idempotent) and must be Ready; then LWS (idempotent too).
real_node() {
  local server node
  server="$(kubectl --kubeconfig "$kubeconfig" config view --minify -o jsonpath='{.clusters[0].cluster.server}')"
  node="$("$here/node.sh" up "$state" "$(pki)" "$server" "$bin")"
  for _ in $(seq 120); do
    kubectl --kubeconfig "$kubeconfig" get node "$node" >/dev/null 2>&1 && break
    sleep 1
  done
  kubectl --kubeconfig "$kubeconfig" wait --for=condition=Ready "node/$node" --timeout 180s >&2
  "$here/lws.sh" up "$state" "$kubeconfig" "$bin"
}

down() {
  # the LWS controller, then the real node: its kubelet must not see the API server go away mid-pod
  "$here/lws.sh" down "$state"
  if [[ -d "$state/node" ]]; then
    # shellcheck source=versions.env source-path=SCRIPTDIR
    "$here/node.sh" down "$state" "$(source "$here/versions.env" && echo "${XDG_CACHE_HOME:-$HOME/.cache}/pagedkube/e2e/$K8S_VERSION/bin")"
  fi
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
  env) tools
       # helm too, for the README's `helm install`
       PATH="$(dirname "$("$python" "$root/tests/tools/binaries.py" helm)"):$PATH"
       echo "export KUBECONFIG=$kubeconfig PATH=$PATH" ;;
  *) echo "usage: $0 up|down|env" >&2; exit 2 ;;
esac
