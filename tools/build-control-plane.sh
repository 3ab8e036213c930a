#!/usr/bin/env bash
# Builds the local cluster's binaries (etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager, kubectl, helm) from the Go modules pinned under tools/, once per
# machine: the output folder is keyed by the pinned versions, so a second run is a no-op.
# Prints the folder holding the binaries on its last line.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
k8s_version="$(awk '/^require k8s.io\/kubernetes/ {print $3}' "$here/k8s/go.mod")"
etcd_version="$(awk '/^require go.etcd.io\/etcd\/server\/v3/ {print $3}' "$here/etcd/go.mod")"
helm_version="$(awk '/^require helm.sh\/helm\/v3/ {print $3}' "$here/helm/go.mod")"
cache="${TPUJOB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tpujob}"
out="$cache/bin/k8s-$k8s_version-etcd-$etcd_version-helm-$helm_version"
want=(etcd kube-apiserver kube-scheduler kube-controller-manager kubectl helm)
missing=()
for b in "${want[@]}"; do [[ -x "$out/$b" ]] || missing+=("$b"); done
if [[ ${#missing[@]} -eq 0 ]]; then echo "$out"; exit 0; fi

export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS="-mod=mod -trimpath"
mkdir -p "$out.partial"
start=$(date +%s)
echo "building ${missing[*]} into $out (a cold build takes 10-25 minutes)" >&2
if [[ ! -x "$out/etcd" ]]; then
  (cd "$here/etcd" && go build -ldflags "-s -w" -o "$out.partial/etcd" .)
fi
if [[ ! -x "$out/helm" ]]; then
  (cd "$here/helm" && go build -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version" \
     -o "$out.partial/helm" helm.sh/helm/v3/cmd/helm)
fi
ld="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1"
ld="$ld -X k8s.io/component-base/version.gitMinor=$(echo "$k8s_version" | cut -d. -f2)"
ld="$ld -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version"
cmds=()
for b in kube-apiserver kube-scheduler kube-controller-manager kubectl; do
  [[ -x "$out/$b" ]] || cmds+=("k8s.io/kubernetes/cmd/$b")
done
if [[ ${#cmds[@]} -gt 0 ]]; then
  (cd "$here/k8s" && go build -ldflags "$ld" -o "$out.partial/" "${cmds[@]}")
fi
mkdir -p "$out"
for f in "$out.partial"/*; do [[ -e "$f" ]] && mv "$f" "$out/"; done
# A build of the same versions running at once may have moved its files and removed it already.
rmdir "$out.partial" 2>/dev/null || true
echo "built in $(( $(date +%s) - start ))s" >&2
echo "$out"
