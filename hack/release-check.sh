#!/usr/bin/env bash
# Proves `make release` end to end against a registry on the loopback address: builds the
# distribution project's registry (tools/build-registry.sh, once per machine), runs it on a free
# port of 127.0.0.1 with its storage in a temporary folder, runs
# `make release REGISTRY=127.0.0.1:PORT/tpujob` into a temporary folder, then checks that
#   - the registry serves each pushed manifest under the digest the release recorded,
#   - each image, its local names removed, pulls back by that digest as the very image built,
#   - `helm template` with the release's values names the operator image by that digest.
# Docker allows plain HTTP to registries on 127.0.0.0/8 without configuration.
#
# Usage: hack/release-check.sh [IMAGE...]   (default: every image; e.g. `operator trainer-cpu`)
set -euo pipefail
cd "$(dirname "$0")/.."

die() { printf 'release-check: %s\n' "$*" >&2; exit 1; }

registry_bin=$(tools/build-registry.sh | tail -n1)
helm=$(tools/build-control-plane.sh | tail -n1)/helm
[[ -x $helm ]] || die "no helm at $helm"

work=$(mktemp -d)
registry_pid=
cleanup() {
  if [[ -n $registry_pid ]]; then kill "$registry_pid" 2>/dev/null || true; wait "$registry_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$work/registry.yml" <<YAML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $work/storage
http:
  addr: 127.0.0.1:$port
YAML
"$registry_bin" serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 100); do
  curl -fsS "http://127.0.0.1:$port/v2/" >/dev/null 2>&1 && break
  kill -0 "$registry_pid" 2>/dev/null || die "the registry exited: $(cat "$work/registry.log")"
  sleep 0.1
done
curl -fsS "http://127.0.0.1:$port/v2/" >/dev/null || die "the registry does not answer on port $port"

registry=127.0.0.1:$port/tpujob
started=$SECONDS
make --no-print-directory release REGISTRY="$registry" RELEASE_DIR="$work/dist" \
  RELEASE_IMAGES="$*"
printf '== released in %ss\n' $((SECONDS - started)) >&2

accept='application/vnd.docker.distribution.manifest.v2+json,application/vnd.oci.image.manifest.v1+json,application/vnd.oci.image.index.v1+json,application/vnd.docker.distribution.manifest.list.v2+json'
while read -r name ref; do
  digest=${ref##*@}
  served=$(curl -fsSI -H "Accept: $accept" "http://127.0.0.1:$port/v2/tpujob/$name/manifests/$digest" \
    | tr -d '\r' | sed -n 's/^[Dd]ocker-[Cc]ontent-[Dd]igest: //p')
  [[ $served == "$digest" ]] || die "$name: the registry serves $digest as '$served'"
  tagged=${ref%@*}
  local_id=$(docker image inspect -f '{{.Id}}' "$tagged")
  docker rmi "$tagged" >/dev/null
  docker image rm "$ref" >/dev/null 2>&1 || true
  docker pull -q "$ref" >/dev/null
  pulled_id=$(docker image inspect -f '{{.Id}}' "$ref")
  [[ $pulled_id == "$local_id" ]] || die "$name: pulled $pulled_id by digest, built $local_id"
  printf '== %s: served and pulled back by digest as image %s\n' "$ref" "${local_id:7:12}" >&2
  docker rmi "$ref" >/dev/null
done <"$work/dist/release-images.txt"

if grep -q '^tpujob-operator ' "$work/dist/release-images.txt"; then
  operator=$(sed -n 's/^tpujob-operator //p' "$work/dist/release-images.txt")
  rendered=$("$helm" template tpujob-operator charts/tpujob-operator -n tpujob-system \
    -f "$work/dist/values-release.yaml" | sed -n 's/^ *image: //p' | sort -u)
  [[ $rendered == "$operator" ]] || die "helm template names '$rendered', not $operator"
  printf '== helm template -f values-release.yaml: image: %s\n' "$rendered" >&2
fi
printf '== release check passed (%s)\n' "$registry" >&2
