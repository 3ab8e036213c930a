#!/usr/bin/env bash
# Builds fake-gcs-server (a local server speaking the Cloud Storage JSON API) from the Go module
# pinned in tools/fake-gcs, once per machine; the e2e tests run it so that gs:// checkpoints
# are written and read for real. Prints the binary's path on its last line.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version="$(awk '/^require github.com\/fsouza\/fake-gcs-server/ {print $3}' "$here/fake-gcs/go.mod")"
cache="${TPUJOB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tpujob}"
out="$cache/bin/fake-gcs-server-$version"
if [[ -x "$out/fake-gcs-server" ]]; then echo "$out/fake-gcs-server"; exit 0; fi
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS="-mod=mod -trimpath"
mkdir -p "$out"
echo "building fake-gcs-server $version (a cold build takes a few minutes)" >&2
(cd "$here/fake-gcs" && go build -ldflags "-s -w" -o "$out/fake-gcs-server.partial" \
   github.com/fsouza/fake-gcs-server)
mv "$out/fake-gcs-server.partial" "$out/fake-gcs-server"
echo "$out/fake-gcs-server"
