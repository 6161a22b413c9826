#!/usr/bin/env bash
# The LeaderWorkerSet controller (sigs.k8s.io/lws, built by `build.sh node`) for the cluster
# with the real node: its CRD, the controller as a process of this machine beside the
# control plane (as kwokctl runs the controller-manager), and its webhooks.
#
#   lws.sh up STATE_DIR KUBECONFIG BIN   install the CRD, start the controller, register its
#                                        webhooks; idempotent
#   lws.sh down STATE_DIR                stop the controller
#
# LWS needs its webhooks: the pod webhook gives every group pod its LWS_LEADER_ADDRESS,
# LWS_WORKER_INDEX and index labels, which the controller and our worker's args read. In a
# cluster LWS serves them behind a Service with a certificate it rotates itself; here the API
# server is a process of this machine too, so the webhooks are registered by URL
# (https://127.0.0.1:PORT, a certificate for 127.0.0.1 from a CA made here) and the controller
# runs with its internal certificate management off. Everything else is LWS's defaults.
set -euo pipefail
# Ports beside the defaults (9443, 8081), as node.sh does for the kubelet's.
WEBHOOK_PORT=10362
HEALTH_PORT=10363

log() { echo "lws.sh: $*" >&2; }

pid_alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

kubectl_() { kubectl --kubeconfig "$kubeconfig" "$@"; }

certs() {
  local c="$dir/certs"
  [[ -f "$c/tls.crt" ]] && return
  mkdir -p "$c"
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=pagedkube-e2e-lws-ca" \
    -keyout "$c/ca.key" -out "$c/ca.crt" 2>/dev/null
  openssl req -new -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout "$c/tls.key" -out "$c/tls.csr" 2>/dev/null
  openssl x509 -req -in "$c/tls.csr" -CA "$c/ca.crt" -CAkey "$c/ca.key" -CAcreateserial -days 30 \
    -extfile <(printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n') -out "$c/tls.crt" 2>/dev/null
}

# webhook NAME PATH RESOURCE: one webhook entry of LWS's config/webhook (with its patches:
# the pod webhooks see only LWS's pods), by URL.
webhook() {
  local group="leaderworkerset.x-k8s.io" selector=""
  if [[ "$3" == pods ]]; then
    group=""
    selector="  objectSelector: {matchExpressions: [{key: leaderworkerset.sigs.k8s.io/name, operator: Exists}]}"
  fi
  cat <<EOF
- name: $1
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  clientConfig: {url: "https://127.0.0.1:$WEBHOOK_PORT$2", caBundle: "$(base64 -w0 < "$dir/certs/ca.crt")"}
  rules: [{apiGroups: ["$group"], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [$3]}]
$selector
EOF
}

# LWS's MutatingWebhookConfiguration and ValidatingWebhookConfiguration (mLWS, mpod; vLWS, vpod).
webhooks() {
  local kind verb
  for kind in Mutating Validating; do
    verb=mutate
    if [[ $kind == Validating ]]; then verb=validate; fi
    cat <<EOF
---
apiVersion: admissionregistration.k8s.io/v1
kind: ${kind}WebhookConfiguration
metadata: {name: lws-${kind,,}-webhook-configuration}
webhooks:
$(webhook "${verb:0:1}leaderworkerset.kb.io" "/$verb-leaderworkerset-x-k8s-io-v1-leaderworkerset" leaderworkersets)
$(webhook "${verb:0:1}pod.kb.io" "/$verb--v1-pod" pods)
EOF
  done
}

up() {
  [[ -x "$bin/lws-controller" && -f "$bin/lws-crd.yaml" ]] || { log "no $bin/lws-controller (build.sh node)"; exit 3; }
  mkdir -p "$dir"
  certs
  # The CRD is 1.2 MB: past client-side apply's annotation, so applied server-side.
  kubectl_ apply --server-side --force-conflicts -f "$bin/lws-crd.yaml" >&2
  # (kubectl wait fails at once on a CRD with no status yet)
  local established="" _
  for _ in $(seq 60); do
    established="$(kubectl_ get crd leaderworkersets.leaderworkerset.x-k8s.io \
      -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null || true)"
    [[ "$established" == True ]] && break
    sleep 1
  done
  [[ "$established" == True ]] || { log "the LeaderWorkerSet CRD is not Established"; exit 1; }
  cat > "$dir/config.yaml" <<EOF
apiVersion: config.lws.x-k8s.io/v1alpha1
kind: Configuration
leaderElection: {leaderElect: false}
internalCertManagement: {enable: false}
webhook: {host: 127.0.0.1, port: $WEBHOOK_PORT, certDir: $dir/certs}
metrics: {bindAddress: "0"}
health: {healthProbeBindAddress: "127.0.0.1:$HEALTH_PORT"}
EOF
  if ! pid_alive "$dir/lws.pid"; then
    KUBECONFIG="$kubeconfig" setsid "$bin/lws-controller" --config "$dir/config.yaml" >>"$dir/lws.log" 2>&1 < /dev/null &
    echo $! > "$dir/lws.pid"
  fi
  local ok=0
  for _ in $(seq 60); do
    if curl -sf "http://127.0.0.1:$HEALTH_PORT/readyz" >/dev/null \
       && curl -s --cacert "$dir/certs/ca.crt" -o /dev/null "https://127.0.0.1:$WEBHOOK_PORT/"; then ok=1; break; fi
    pid_alive "$dir/lws.pid" || break
    sleep 1
  done
  [[ $ok == 1 ]] || { log "the LWS controller did not come up:"; tail -30 "$dir/lws.log" >&2; exit 1; }
  webhooks | kubectl_ apply -f - >&2
}

down() {
  local f="$dir/lws.pid" pid
  pid_alive "$f" || { rm -f "$f"; return 0; }
  pid="$(cat "$f")"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$f"
}

case "${1:-}" in
  up) dir="$2/lws"; kubeconfig="$3"; bin="$4"; up ;;
  down) dir="$2/lws"; down ;;
  *) echo "usage: $0 up STATE_DIR KUBECONFIG BIN | down STATE_DIR" >&2; exit 2 ;;
esac
