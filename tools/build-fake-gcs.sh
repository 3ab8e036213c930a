#!/usr/bin/env bash
# Builds fake-gcs-server (a local server speaking the Cloud Storage JSON API) from the Go module
# pinned in tools/fake-gcs, once per machine; the e2e tests run it so that gs:// checkpoints
# are written and read for real. Prints the binary's path on its last line.
set -euo pipefail
exec "$(dirname "$0")/build-go-tool.sh" fake-gcs github.com/fsouza/fake-gcs-server \
  github.com/fsouza/fake-gcs-server fake-gcs-server
