#!/usr/bin/env bash
# Builds the peers the scale benchmark (bench/bench_scale.py) runs against: kwok, which fakes
# GKE TPU node pools and pods, and the JobSet controller with its in-place restart agent (run in
# each pod of bench/bench_goodput.py's InPlaceRestart arm). Like tools/build-control-plane.sh, a
# wrapper module per tool pins the release (tools/kwok/go.mod, tools/jobset/go.mod, with go.sum),
# and the output folder is keyed by the pinned versions, so a second run is a no-op. Prints the
# folder on its last line.
#
#   tools/build-bench-peers.sh                       # niced, one package at a time
#   NICE=0 GOPARALLEL=4 tools/build-bench-peers.sh   # faster on an idle machine
#
# A cold build takes about 4 minutes per tool on 2 cores and peaks near 1 GB of memory.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
kwok_version="$(awk '/^require sigs.k8s.io\/kwok/ {print $3}' "$here/kwok/go.mod")"
jobset_version="$(awk '/^require sigs.k8s.io\/jobset/ {print $3}' "$here/jobset/go.mod")"
cache="${TPUJOB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tpujob}"
out="$cache/bin/peers-kwok-$kwok_version-jobset-$jobset_version"
agent=jobset-in-place-restart-agent
if [[ -x "$out/kwok" && -x "$out/jobset" && -x "$out/$agent" ]]; then echo "$out"; exit 0; fi

export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0
export GOFLAGS="-mod=mod -trimpath -buildvcs=false -p=${GOPARALLEL:-1}"
nice="nice -n ${NICE:-19}"
mkdir -p "$out.partial"
start=$(date +%s)
if [[ ! -x "$out/kwok" ]]; then
  (cd "$here/kwok" && $nice go build -ldflags "-s -w" -o "$out.partial/kwok" \
     sigs.k8s.io/kwok/cmd/kwok)
fi
if [[ ! -x "$out/jobset" ]]; then
  # main.go sits at the module root: the package path is the module path.
  (cd "$here/jobset" && $nice go build \
     -ldflags "-s -w -X sigs.k8s.io/jobset/pkg/version.GitVersion=$jobset_version" \
     -o "$out.partial/jobset" sigs.k8s.io/jobset)
fi
if [[ ! -x "$out/$agent" ]]; then
  (cd "$here/jobset" && $nice go build -ldflags "-s -w" -o "$out.partial/$agent" \
     sigs.k8s.io/jobset/cmd/in-place-restart-agent)
fi
mkdir -p "$out"
for f in "$out.partial"/*; do [[ -e "$f" ]] && mv "$f" "$out/"; done
# A build of the same versions running at once may have moved its files and removed it already.
rmdir "$out.partial" 2>/dev/null || true
echo "built in $(( $(date +%s) - start ))s" >&2
echo "$out"
