#!/usr/bin/env bash
# What the e2e and node tiers build and the CPU-bound tiers do not, started first by
# `make test` so it overlaps them: the node's images (mostly network and disk; root
# only), then the control plane's and the node's Go binaries (build.sh).
#   prebuild.sh start   in the background; log in build/prebuild.log
#   prebuild.sh wait    until a started prebuild has ended, then print its log's tail
#                       (3 lines, or 60 when it failed)
# The tiers then run build.sh and images.sh themselves: they find everything cached,
# or build (and report) what the prebuild did not.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
pidfile="$root/build/prebuild.pid"
logfile="$root/build/prebuild.log"

run() {
  local status=0
  if [[ "$(id -u)" == 0 ]]; then "$here/images.sh" build || status=$?; fi
  if command -v go >/dev/null; then
    if [[ "$(id -u)" == 0 ]]; then "$here/build.sh" node || status=$?; else "$here/build.sh" || status=$?; fi
  fi
  echo "prebuild.sh: ended with status $status after $SECONDS s"
  return "$status"
}

case "${1:-}" in
  start)
    mkdir -p "$root/build"
    nohup "$0" run > "$logfile" 2>&1 < /dev/null &
    echo $! > "$pidfile"
    echo "prebuild: images and cluster binaries building in the background (log: build/prebuild.log)" ;;
  run) run ;;
  wait)
    [[ -f "$pidfile" ]] || exit 0
    pid="$(cat "$pidfile")"
    while grep -qs prebuild.sh "/proc/$pid/cmdline"; do sleep 5; done
    rm -f "$pidfile"
    # a failed prebuild's cause is what CI's log must show: the tiers' own rebuild may fail later
    if grep -q "ended with status 0 " "$logfile"; then tail -n 3 "$logfile"; else tail -n 60 "$logfile"; fi ;;
  *) echo "usage: $0 start|wait" >&2; exit 2 ;;
esac
