#!/usr/bin/env bash
# The whole product on a real kind cluster (needs a Docker engine; CI's `kind` job):
# create the cluster, build both images, load them, install the chart, apply the
# CPU example and send a chat completion through the gateway.
#
#   e2e/kind/run.sh          run, then delete the cluster
#   KEEP=1 e2e/kind/run.sh   leave the cluster running (kind delete cluster --name pagedkube-kind)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=../cluster/versions.env source-path=SCRIPTDIR
source "$here/../cluster/versions.env"
name="${KIND_CLUSTER:-pagedkube-kind}"
python="${PYTHON:-$root/.venv/bin/python}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/pagedkube/kind/$KIND_VERSION"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/pyproject.toml")"
port="${PORT:-18080}"

log() { echo "kind/run.sh: $*" >&2; }
docker info >/dev/null 2>&1 || { log "no Docker engine: this script needs one"; exit 3; }

if ! command -v kind >/dev/null; then
  [[ -x "$cache/kind" ]] || GOBIN="$cache" go install "sigs.k8s.io/kind@$KIND_VERSION"
  PATH="$cache:$PATH"
fi
kubectl="$("$python" "$root/tests/tools/binaries.py" kubectl)"
helm="$("$python" "$root/tests/tools/binaries.py" helm)"
kubeconfig="$(mktemp)"
pf=""
cleanup() {
  if [[ -n "$pf" ]]; then kill "$pf" 2>/dev/null || true; fi
  rm -f "$kubeconfig"
  [[ "${KEEP:-0}" == 1 ]] || kind delete cluster --name "$name" >&2 || true
}
trap cleanup EXIT

kind get clusters 2>/dev/null | grep -qx "$name" || kind create cluster --name "$name" --wait 3m
kind get kubeconfig --name "$name" > "$kubeconfig"
k() { "$kubectl" --kubeconfig "$kubeconfig" "$@"; }

log "building images $version"
make -C "$root" images
kind load docker-image --name "$name" "ghcr.io/pagedkube/engine:$version" "ghcr.io/pagedkube/gateway:$version"

"$helm" --kubeconfig "$kubeconfig" upgrade --install pagedkube "$root/charts/pagedkube" \
  -n pagedkube-system --create-namespace --wait --timeout 5m
k apply -f "$root/manifests/examples/llmservice.yaml"
k wait --for=condition=Ready llms/smollm2 --timeout 10m
k get llms smollm2

k port-forward svc/smollm2 "$port:80" >&2 &
pf=$!
for _ in $(seq 60); do
  curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  sleep 1
done
reply="$(curl -fsS "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}')"
echo "$reply"
"$python" -c 'import json, sys; r = json.loads(sys.argv[1]); assert r["object"] == "chat.completion" and r["choices"][0]["message"]["content"] is not None, r' "$reply"
log "chat completion through the gateway: ok"
