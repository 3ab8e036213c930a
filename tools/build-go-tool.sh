#!/usr/bin/env bash
# Builds one Go command from a module pinned in a folder of tools/ (its go.mod and go.sum), once
# per machine, into the tools cache. Prints the binary's path on its last line.
#
# Usage: tools/build-go-tool.sh FOLDER MODULE PACKAGE NAME
#   FOLDER   the folder of tools/ whose go.mod requires MODULE (at the version built)
#   PACKAGE  the command's package in MODULE, built as NAME
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
folder=$1 module=$2 package=$3 name=$4
version="$(awk -v module="$module" '$1 == "require" && $2 == module {print $3}' "$here/$folder/go.mod")"
if [[ -z $version ]]; then
  echo "build-go-tool: tools/$folder/go.mod does not require $module" >&2
  exit 1
fi
cache="${TPUJOB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tpujob}"
out="$cache/bin/$name-$version"
if [[ -x "$out/$name" ]]; then echo "$out/$name"; exit 0; fi
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS="-mod=mod -trimpath"
mkdir -p "$out"
echo "building $name $version (a cold build takes a few minutes)" >&2
(cd "$here/$folder" && go build -ldflags "-s -w" -o "$out/$name.partial" "$package")
mv "$out/$name.partial" "$out/$name"
echo "$out/$name"
