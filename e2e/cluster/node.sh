#!/usr/bin/env bash
# A real Kubernetes node on this machine, joined to the cluster cluster.sh runs:
# kubelet and kube-proxy (built by build.sh from the same k8s.io/kubernetes),
# containerd v2 (built by build.sh from github.com/containerd/containerd/v2) with
# runc (Debian), the CNI bridge/host-local/portmap/loopback
# plugins (Debian) on a pod CIDR, CoreDNS (build.sh node) on the node's address as
# the pods' cluster DNS (cluster.local: Services and LWS's pod names), and the images from images.sh imported into
# containerd's k8s.io namespace (the pause image is containerd's sandbox_image,
# so nothing is ever pulled). Needs root.
#
#   node.sh up STATE_DIR PKI_DIR SERVER BIN    start (idempotent); prints the node name
#   node.sh down STATE_DIR                     stop it and remove every trace
#
# `down` leaves no process, mount, network namespace, veth, bridge, iptables rule
# or cgroup behind. Only containerd's image store survives, under
# ${XDG_CACHE_HOME:-~/.cache}/pagedkube/node/containerd, so the next `up` imports nothing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
NODE_NAME="${PAGEDKUBE_E2E_NODE_NAME:-pagedkube-node}"
# 10.244.0.0/16 is the usual pod range (kind, flannel); the service range is
# kube-apiserver's default 10.0.0.0/24 (kwokctl passes none).
CLUSTER_CIDR=10.244.0.0/16
POD_CIDR=10.244.0.0/24
BRIDGE=pagedkube0
CGROUP_ROOT=/pagedkube-e2e
# Ports beside the defaults (10250, 10256, 10249) so a node of another tool does not clash.
KUBELET_PORT=10350
KUBELET_HEALTHZ_PORT=10348
PROXY_METRICS_PORT=10349
PROXY_HEALTHZ_PORT=10356
CNI_BIN=/usr/lib/cni
store="${XDG_CACHE_HOME:-$HOME/.cache}/pagedkube/node/containerd"

log() { echo "node.sh: $*" >&2; }

# The machine's address on its default route: what the API server reaches the kubelet at.
node_ip() { ip -4 route get 1.1.1.1 | sed -n 's/.* src \([0-9.]*\).*/\1/p'; }

need() {
  local missing=()
  for c in runc iptables ip openssl; do
    command -v "$c" >/dev/null || missing+=("$c")
  done
  for c in containerd containerd-shim-runc-v2 ctr kubelet kube-proxy coredns; do
    [[ -x "$bin/$c" ]] || missing+=("$bin/$c (build.sh node)")
  done
  for p in bridge host-local loopback portmap; do [[ -x "$CNI_BIN/$p" ]] || missing+=("$CNI_BIN/$p"); done
  if [[ ${#missing[@]} -gt 0 ]]; then
    log "missing ${missing[*]}: apt-get install runc containernetworking-plugins iptables conntrack openssl"
    exit 3
  fi
  [[ "$(id -u)" == 0 ]] || { log "a real node needs root"; exit 3; }
}

# pid_alive FILE: the process recorded in FILE is running.
pid_alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# start NAME LOG CMD...: runs CMD in the background, its pid in $dir/NAME.pid.
start() {
  local name="$1" logf="$2"; shift 2
  pid_alive "$dir/$name.pid" && return
  setsid "$@" >>"$logf" 2>&1 < /dev/null &
  echo $! > "$dir/$name.pid"
}

wait_for() {  # wait_for WHAT SECONDS CMD...
  local what="$1" secs="$2"; shift 2
  for _ in $(seq "$secs"); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
  log "timed out after ${secs}s waiting for $what"; return 1
}

write_configs() {
  mkdir -p "$dir/cni" "$dir/kubelet" "$dir/certs" "$dir/pod-logs" "$dir/containerd-state" "$store"
  # containerd 2's configuration version 3 (docs/cri/config.md in containerd v2).
  cat > "$dir/containerd.toml" <<EOF
version = 3
root = "$store"
state = "$dir/containerd-state"
[grpc]
  address = "$dir/containerd.sock"
[ttrpc]
  address = "$dir/containerd.sock.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$PAUSE_REF"
[plugins."io.containerd.cri.v1.runtime"]
  # This sandbox lacks CAP_SYS_RESOURCE: no process may lower its oom_score_adj,
  # and runc fails every pod kubelet asks -998 for. Clamp it instead.
  restrict_oom_score_adj = true
  enable_selinux = false
  # pod network namespaces under the state dir (not /var/run/netns), so down finds ours
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$CNI_BIN"]
    conf_dir = "$dir/cni"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
  cat > "$dir/cni/10-pagedkube.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "pagedkube-e2e",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$dir/cni-ipam",
              "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  # The kubelet's client certificate: system:node:NAME in system:nodes, signed by the cluster CA.
  if [[ ! -f "$dir/certs/kubelet-client.crt" ]]; then
    openssl req -new -newkey rsa:2048 -nodes -keyout "$dir/certs/kubelet-client.key" \
      -subj "/O=system:nodes/CN=system:node:$NODE_NAME" -out "$dir/certs/kubelet-client.csr" 2>/dev/null
    openssl x509 -req -in "$dir/certs/kubelet-client.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
      -CAcreateserial -days 30 -out "$dir/certs/kubelet-client.crt" 2>/dev/null
  fi
  kubeconfig_for kubelet "$dir/certs/kubelet-client.crt" "$dir/certs/kubelet-client.key"
  # kube-proxy and CoreDNS as the admin (kwokctl's single certificate): they only read Services,
  # EndpointSlices (and CoreDNS Namespaces).
  kubeconfig_for kube-proxy "$pki/admin.crt" "$pki/admin.key"
  kubeconfig_for coredns "$pki/admin.crt" "$pki/admin.key"
  # The cluster's DNS on the node's address (kubelet's clusterDNS), as kube-dns would answer:
  # Services, pods by hostname.subdomain (LWS_LEADER_ADDRESS), other names forwarded.
  cat > "$dir/Corefile" <<EOF
.:53 {
    bind $ip
    errors
    cache 5
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $dir/coredns.kubeconfig coredns
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    forward . /etc/resolv.conf
}
EOF
  cat > "$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $ip
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
containerRuntimeEndpoint: unix://$dir/containerd.sock
# cgroup v1 is what this machine mounts; no systemd runs here.
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupRoot: $CGROUP_ROOT
failSwapOn: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
# The disk is shared with everything else on the machine: never evict or GC for it.
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, nodefs.inodesFree: 1%, imagefs.available: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
localStorageCapacityIsolation: false
serializeImagePulls: false
podLogsDir: $dir/pod-logs
resolvConf: /etc/resolv.conf
clusterDNS: ["$ip"]
clusterDomain: cluster.local
EOF
  cat > "$dir/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $dir/kube-proxy.kubeconfig}
hostnameOverride: $NODE_NAME
bindAddress: $ip
clusterCIDR: $CLUSTER_CIDR
mode: iptables
metricsBindAddress: 127.0.0.1:$PROXY_METRICS_PORT
healthzBindAddress: 127.0.0.1:$PROXY_HEALTHZ_PORT
# 0: leave the host's conntrack table size and timeouts alone.
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
# NodePorts on the node's address only (no localhost NodePorts, so no route_localnet).
nodePortAddresses: [primary]
EOF
}

kubeconfig_for() {  # kubeconfig_for NAME CERT KEY
  cat > "$dir/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: "$server", certificate-authority: "$pki/ca.crt"}}]
users: [{name: $1, user: {client-certificate: "$2", client-key: "$3"}}]
contexts: [{name: $1, context: {cluster: e2e, user: $1}}]
current-context: $1
EOF
}

ctr_() { "$bin/ctr" --address "$dir/containerd.sock" -n k8s.io "$@"; }

# Whether the store lists image REF. grep reads the whole list: with `grep -q`, grep exits at
# the first match and ctr, still writing (the CRI plugin also lists each image by its ID),
# dies of SIGPIPE, which pipefail turns into "not there" (seen on a fresh store).
has_image() { ctr_ images ls -q | grep -x "$1" >/dev/null; }

# Import each image archive unless this store already holds that exact archive.
import_images() {
  local name archive ref
  while read -r name archive ref; do
    local mark
    mark="$store/imported-$(basename "$archive")"
    if [[ -f "$mark" ]] && has_image "$ref"; then continue; fi
    log "importing $ref"
    # the layers' blobs are dropped once unpacked (--local: the only way ctr can): pods run from the snapshots
    ctr_ images import --local --snapshotter overlayfs --discard-unpacked-layers "$archive" >&2
    has_image "$ref" || { log "$archive did not give $ref"; exit 1; }
    rm -f "$store/imported-$name-"*
    touch "$mark"
  done < <("$here/images.sh" build)
}

up() {
  need
  save_sysctls
  sysctl -qw net.ipv4.ip_forward=1
  [[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]] || modprobe br_netfilter 2>/dev/null || true
  [[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]] && sysctl -qw net.bridge.bridge-nf-call-iptables=1
  PAUSE_REF="$("$here/images.sh" refs | sed -n 's/^pause //p')"
  ip="$(node_ip)"
  write_configs
  make_cgroup_root
  # containerd finds its shim (containerd-shim-runc-v2) on PATH
  start containerd "$dir/containerd.log" env PATH="$bin:$PATH" "$bin/containerd" --config "$dir/containerd.toml"
  wait_for containerd 60 ctr_ version
  import_images
  start coredns "$dir/coredns.log" "$bin/coredns" -conf "$dir/Corefile"
  start kubelet "$dir/kubelet.log" "$bin/kubelet" --config "$dir/kubelet.yaml" \
    --kubeconfig "$dir/kubelet.kubeconfig" --root-dir "$dir/kubelet" --cert-dir "$dir/certs" \
    --hostname-override "$NODE_NAME" --node-ip "$ip" \
    --node-labels "pagedkube.io/e2e-node=real" --v 1
  start kube-proxy "$dir/kube-proxy.log" "$bin/kube-proxy" --config "$dir/kube-proxy.yaml" --v 1
  echo "$NODE_NAME"
}

down() {
  [[ -d "$dir" ]] || return 0
  for p in kube-proxy kubelet coredns; do stop "$p"; done
  # Every pod sandbox and container, then containerd itself.
  if pid_alive "$dir/containerd.pid"; then
    local id
    for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$id" 2>/dev/null || true; done
    sleep 1
    for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$id" 2>/dev/null || true; done
    for id in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$id" 2>/dev/null || true; done
  fi
  stop containerd
  # shims outlive containerd by design: end the ones started for this state dir
  local pid
  for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $dir/containerd.sock" || true); do kill -9 "$pid" 2>/dev/null || true; done
  if [[ -x "$bin/kube-proxy" ]]; then "$bin/kube-proxy" --cleanup >/dev/null 2>&1 || true; fi
  unmount_under "$dir"
  unmount_under "$store"
  ip link show "$BRIDGE" >/dev/null 2>&1 && ip link delete "$BRIDGE"
  iptables_cleanup
  local c
  for c in /sys/fs/cgroup/*/"${CGROUP_ROOT#/}"; do
    if [[ -d "$c" ]]; then find "$c" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
  done
  # kubelet's symlinks to our pods' logs (its /var/log/containers is not configurable)
  find /var/log/containers -maxdepth 1 -type l -lname "$dir/*" -delete 2>/dev/null || true
  restore_sysctls
  rm -rf "$dir"
}

# The kernel settings the node changes (kubelet sets the vm./kernel. ones it
# wants): saved at the first up, put back at down.
SYSCTLS="net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables vm.overcommit_memory vm.panic_on_oom
kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes"
save_sysctls() {
  [[ -f "$dir/sysctl.saved" ]] && return
  local k
  for k in $SYSCTLS; do
    if sysctl -n "$k" >/dev/null 2>&1; then echo "$k=$(sysctl -n "$k")"; fi
  done > "$dir/sysctl.saved"
}
restore_sysctls() {
  [[ -f "$dir/sysctl.saved" ]] || return 0
  local kv
  while read -r kv; do sysctl -qw "$kv" 2>/dev/null || true; done < "$dir/sysctl.saved"
}

# kubelet wants its cgroupRoot to exist in every hierarchy; a new cpuset cgroup
# (cgroup v1) starts with no CPUs or memory nodes until given its parent's.
make_cgroup_root() {
  local h
  for h in /sys/fs/cgroup/*/; do
    [[ -d "$h" && ! -L "${h%/}" ]] || continue
    mkdir -p "$h${CGROUP_ROOT#/}"
    if [[ -f "$h/cpuset.cpus" ]]; then
      cat "$h/cpuset.cpus" > "$h${CGROUP_ROOT#/}/cpuset.cpus"
      cat "$h/cpuset.mems" > "$h${CGROUP_ROOT#/}/cpuset.mems"
    fi
  done
}

stop() {  # stop NAME: TERM, then KILL after 20 s
  local f="$dir/$1.pid"
  pid_alive "$f" || { rm -f "$f"; return 0; }
  local pid; pid="$(cat "$f")"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$f"
}

unmount_under() {  # deepest first
  local m
  while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done < <(awk -v d="$1/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r)
}

# The chains this node's components made: the bridge plugin's masquerade chains
# (CNI-<hash>) and portmap's (CNI-HOSTPORT-*, CNI-DN-*), kube-proxy's and
# kubelet's (KUBE-*, canaries included). Nothing else on the machine uses these
# prefixes. Rules in built-in chains that jump to them go first, then the chains.
iptables_cleanup() {
  local cmd t rule chain
  for cmd in iptables ip6tables; do
    command -v "$cmd" >/dev/null || continue
    for t in filter nat mangle; do
      while read -r rule; do
        if [[ -n "$rule" ]]; then eval "$cmd -t $t ${rule/-A/-D}" 2>/dev/null || true; fi
      done < <("$cmd" -t "$t" -S 2>/dev/null | grep '^-A' | grep -vE '^-A (CNI|KUBE)-' \
                 | grep -E -- '-j (CNI|KUBE)-|pagedkube-e2e' || true)
      for chain in $("$cmd" -t "$t" -S 2>/dev/null | sed -n 's/^-N \(\(CNI\|KUBE\)-[A-Za-z0-9-]*\).*/\1/p'); do
        "$cmd" -t "$t" -F "$chain" 2>/dev/null || true
      done
      for chain in $("$cmd" -t "$t" -S 2>/dev/null | sed -n 's/^-N \(\(CNI\|KUBE\)-[A-Za-z0-9-]*\).*/\1/p'); do
        "$cmd" -t "$t" -X "$chain" 2>/dev/null || true
      done
    done
  done
}

case "${1:-}" in
  up) dir="$2/node"; pki="$3"; server="$4"; bin="$5"; mkdir -p "$dir"; up ;;
  down) dir="$2/node"; bin="${3:-}"; down ;;
  *) echo "usage: $0 up STATE_DIR PKI_DIR SERVER BIN | down STATE_DIR [BIN]" >&2; exit 2 ;;
esac
