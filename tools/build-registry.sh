#!/usr/bin/env bash
# Builds the distribution project's registry (the reference OCI registry) from the Go module
# pinned in tools/registry, once per machine; hack/release-check.sh runs it on the loopback
# address to push a release to and pull it back. Prints the binary's path on its last line.
set -euo pipefail
exec "$(dirname "$0")/build-go-tool.sh" registry github.com/distribution/distribution/v3 \
  github.com/distribution/distribution/v3/cmd/registry registry
