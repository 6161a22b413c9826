#!/usr/bin/env bash
# Container images for the real e2e node, built here without Docker or a registry:
#   base     Debian bookworm + python3.11 by debootstrap, the stand-in for the
#            Dockerfiles' python:3.11-slim-bookworm (passed as ARG PYTHON_IMAGE)
#   pause    the pod sandbox image: one static Go binary that sleeps until signalled
#   gateway  buildah from Dockerfile.gateway -> ghcr.io/pagedkube/gateway:<version>
#   engine   buildah from Dockerfile.engine  -> ghcr.io/pagedkube/engine:<version>
# The tags are the ones the chart and the operator default to, so a plain
# `helm install` finds them in the node's image store and pulls nothing.
# Each image is written once to an OCI archive named by a hash of its inputs:
#   ${XDG_CACHE_HOME:-~/.cache}/pagedkube/images/<name>-<hash>.tar
# so unchanged sources are not rebuilt; buildah's --layers cache (storage under
# the same folder) keeps the engine's pip layer when only our sources change.
#
#   images.sh build [NAME...]   build what is missing; prints "NAME ARCHIVE REF" lines
#   images.sh refs              prints "NAME REF" for every image (no build)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/pagedkube/images"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/pyproject.toml")"
# The base image stands in for python:3.11-slim-bookworm: Debian 12 with its python3.11.
SUITE=bookworm
MIRROR="${PAGEDKUBE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${PAGEDKUBE_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
# libpython3.11-dev: the official image ships the C headers (Triton compiles its launcher against them).
BASE_PACKAGES="python3.11 python3.11-venv libpython3.11-dev python-is-python3 ca-certificates"
# Extra CA certificates the machine trusts (a TLS-intercepting proxy's, a mirror's) go into
# the base image's trust store, and pip is told to use that store (/etc/pip.conf).
EXTRA_CA_DIR="${PAGEDKUBE_EXTRA_CA_DIR:-/usr/local/share/ca-certificates}"
BASE_REF=localhost/pagedkube/python:3.11-$SUITE
PAUSE_REF=localhost/pagedkube/pause:3.10
GATEWAY_REF=ghcr.io/pagedkube/gateway:$version
ENGINE_REF=ghcr.io/pagedkube/engine:$version

# buildah commits a new layer through two temporary copies of it under TMPDIR (/var/tmp by
# default; podman#22342): 11.4 GB for the engine's torch + CUDA venv layer, measured. A CI
# machine whose /var/tmp is small (a tmpfs) then fails with "storing layer ... to file: io:
# read/write on closed pipe". Keep them under the cache, on the disk free_space checks. Only
# buildah gets this TMPDIR: the base image's chroot (apt's maintainer scripts, which build the CA
# bundle) would not find the directory and fail quietly.
buildah_tmp="$cache/tmp/buildah"
# Free disk an engine image build needs beside what is there. Cold, measured: the 5.7 GB venv
# layer as the working container's copy, two temporary copies and the committed layer at once
# (23 GB), then the archive. When buildah's storage holds an engine image its layer cache has
# that layer, and only our thin layers and a new archive are written (about 8 GB).
# PAGEDKUBE_IMAGES_MIN_FREE_GB overrides both (0 skips the check). When a build leaves less
# than its cold need free, the layer cache (7 GB) is dropped: the archives stay valid, the
# node tier needs the room (containerd unpacks the engine image: 6 GB, 12 while importing),
# and the next change to our sources rebuilds the engine image from the start. The gateway
# image (0.5 GB) asks nothing.
ENGINE_COLD_GB=24
ENGINE_WARM_GB=8

log() { echo "images.sh: [$SECONDS s] $*" >&2; }
bah() { TMPDIR="$buildah_tmp" buildah --root "$cache/storage" --runroot "$cache/run" --storage-driver overlay "$@"; }

free_gb() { df --output=avail -BG "$1" | tail -n 1 | tr -dc 0-9; }

# disk_report: what a failed build leaves to read (the usual cause is a full disk).
disk_report() {
  log "disk: $(df -h --output=target,size,avail "$cache" "$buildah_tmp" /var/tmp | tail -n +2 | sort -u | tr -s ' ' | paste -sd ';')"
  log "cache: $(du -sh "$cache"/* 2>/dev/null | tr '\t' ' ' | paste -sd ';')"
}

# free_space NAME GB: fail now, saying why, when the cache's disk has less than GB free.
free_space() {
  local avail
  avail="$(free_gb "$cache")"
  if (( avail < $2 )); then
    log "building $1 needs about $2 GB free on the disk of $cache; it has $avail GB (set PAGEDKUBE_IMAGES_MIN_FREE_GB to change the check)"
    disk_report
    exit 4
  fi
}

# sha256 over the named files' paths and contents (tracked and untracked, not ignored).
hash_inputs() {
  (cd "$root" && git ls-files -z -co --exclude-standard -- "$@" | sort -z \
     | xargs -0 sha256sum) | sha256sum | cut -c1-16
}

build_base() {
  local key out
  key="$( (echo "$SUITE $MIRROR $SECURITY_MIRROR $BASE_PACKAGES"; declare -f build_base; extra_cas | xargs -r cat) \
    | sha256sum | cut -c1-16)"
  out="$cache/base-$key.tar"
  if [[ ! -f "$out" ]]; then
    local rootfs="$cache/tmp/base-rootfs"
    rm -rf "$rootfs" && mkdir -p "$rootfs"
    log "debootstrap $SUITE ($BASE_PACKAGES)"
    debootstrap --variant=minbase "$SUITE" "$rootfs" "$MIRROR" >&2
    cat > "$rootfs/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY_MIRROR $SUITE-security main
EOF
    # apt inside the new root resolves the packages' dependencies (debootstrap's --include does not fully)
    chroot "$rootfs" sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $BASE_PACKAGES && apt-get clean" >&2
    if [[ -n "$(extra_cas)" ]]; then
      extra_cas | xargs -r cp -t "$rootfs/usr/local/share/ca-certificates/"
      chroot "$rootfs" update-ca-certificates >&2
      printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$rootfs/etc/pip.conf"
    fi
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* \
      "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/var/log/*.log
    local c
    c="$(bah from scratch)"
    bah copy "$c" "$rootfs" / >/dev/null
    bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      --env LANG=C.UTF-8 --env PYTHON_VERSION=3.11 --cmd python3 \
      --label org.opencontainers.image.description="Debian $SUITE + python3.11 (debootstrap), for pagedkube e2e" "$c"
    bah commit --rm "$c" "$BASE_REF" >/dev/null
    bah push "$BASE_REF" "oci-archive:$out.part:$BASE_REF" >&2
    mv "$out.part" "$out"
    rm -rf "$rootfs"
    find "$cache" -maxdepth 1 -name "base-*.tar" ! -name "$(basename "$out")" -delete
  fi
  # buildah resolves ARG PYTHON_IMAGE from its own storage.
  bah inspect --type image "$BASE_REF" >/dev/null 2>&1 || bah pull "oci-archive:$out" >/dev/null
  echo "base $out $BASE_REF"
}

extra_cas() { find "$EXTRA_CA_DIR" -maxdepth 1 -name '*.crt' 2>/dev/null | sort; }

build_pause() {
  local key out
  key="$(declare -f build_pause | sha256sum | cut -c1-16)"
  out="$cache/pause-$key.tar"
  if [[ ! -f "$out" ]]; then
    local d="$cache/tmp/pause"
    rm -rf "$d" && mkdir -p "$d"
    cat > "$d/main.go" <<'GO'
// pause: the pod sandbox's process. It holds the pod's namespaces, reaps
// orphans as PID 1 and exits 0 on SIGINT/SIGTERM.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			if pid, _ := syscall.Wait4(-1, nil, syscall.WNOHANG, nil); pid <= 0 {
				break
			}
		}
	}
}
GO
    printf 'module pagedkube.io/e2e/pause\n\ngo 1.21\n' > "$d/go.mod"
    (cd "$d" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -ldflags "-s -w" -o pause .)
    local c
    c="$(bah from scratch)"
    bah copy "$c" "$d/pause" /pause >/dev/null
    bah config --entrypoint '["/pause"]' --user 65535:65535 "$c"
    bah commit --rm "$c" "$PAUSE_REF" >/dev/null
    bah push "$PAUSE_REF" "oci-archive:$out.part:$PAUSE_REF" >&2
    mv "$out.part" "$out"
    rm -rf "$d"
    find "$cache" -maxdepth 1 -name "pause-*.tar" ! -name "$(basename "$out")" -delete
  fi
  echo "pause $out $PAUSE_REF"
}

# build_dockerfile NAME DOCKERFILE REF [COLD_GB WARM_GB]: buildah bud with the local base image,
# first checking for COLD_GB free (WARM_GB when buildah's storage already holds REF's layers).
build_dockerfile() {
  local name="$1" dockerfile="$2" ref="$3" cold_gb="${4:-0}" warm_gb="${5:-0}" key out base_out need
  read -r _ base_out _ <<< "$(build_base)"
  key="$(echo "$(hash_inputs "$dockerfile" docker pyproject.toml setup.py README.md pagedkube engine gateway operator) $(basename "$base_out") $ref" | sha256sum | cut -c1-16)"
  out="$cache/$name-$key.tar"
  if [[ ! -f "$out" ]]; then
    if (( cold_gb > 0 )); then
      need=$cold_gb
      bah inspect --type image "$ref" >/dev/null 2>&1 && need=$warm_gb
      free_space "$ref" "${PAGEDKUBE_IMAGES_MIN_FREE_GB:-$need}"
    fi
    log "building $ref from $dockerfile"
    local t0=$SECONDS
    # docker format keeps the Dockerfiles' HEALTHCHECK (OCI image configs have no field for it)
    (cd "$root" && bah bud --layers --force-rm --pull=false --isolation chroot --network host --format docker \
       --build-arg "PYTHON_IMAGE=$BASE_REF" -f "$dockerfile" -t "$ref" . >&2) || { disk_report; return 1; }
    # A docker archive: uncompressed (gzip of the engine's torch layer would cost minutes
    # of CPU for a local import), and it keeps the docker-format config.
    bah push "$ref" "docker-archive:$out.part:$ref" >&2 || { rm -f "$out.part"; disk_report; return 1; }
    mv "$out.part" "$out"
    log "$ref built in $(( SECONDS - t0 )) s"
    find "$cache" -maxdepth 1 -name "$name-*.tar" ! -name "$(basename "$out")" -delete
    if (( $(free_gb "$cache") < cold_gb )); then
      log "less than $cold_gb GB left free: dropping buildah's layer cache (the archives stay valid)"
      bah rmi --all --force >/dev/null
    fi
  fi
  echo "$name $out $ref"
}

build() {
  # A killed build leaves buildah working containers mounted and temporary layer copies:
  # remove them, now and at exit.
  rm -rf "$buildah_tmp" && mkdir -p "$buildah_tmp"
  bah rm --all >/dev/null 2>&1 || true
  trap 'bah rm --all >/dev/null 2>&1 || true; rm -rf "$buildah_tmp"' EXIT
  local names=("$@")
  [[ ${#names[@]} -gt 0 ]] || names=(pause gateway engine)
  for n in "${names[@]}"; do
    case "$n" in
      base) build_base ;;
      pause) build_pause ;;
      gateway) build_dockerfile gateway Dockerfile.gateway "$GATEWAY_REF" ;;
      engine) build_dockerfile engine Dockerfile.engine "$ENGINE_REF" "$ENGINE_COLD_GB" "$ENGINE_WARM_GB" ;;
      *) echo "images.sh: unknown image $n" >&2; exit 2 ;;
    esac
  done
}

case "${1:-}" in
  build) shift; build "$@" ;;
  refs) printf 'pause %s\ngateway %s\nengine %s\n' "$PAUSE_REF" "$GATEWAY_REF" "$ENGINE_REF" ;;
  *) echo "usage: $0 build [base|pause|gateway|engine]... | refs" >&2; exit 2 ;;
esac
