#!/usr/bin/env bash
# Publishes the project's images to a registry the user names (`make release REGISTRY=...`):
# builds and checks them with hack/build-images.sh (under their usual names, so that its cache
# serves), tags each REGISTRY/NAME:VERSION, pushes it, and writes what was pushed, by digest:
#
#   dist/values-release.yaml   the chart's values for the operator image (repository, tag and
#                              the pushed digest): helm install ... -f dist/values-release.yaml
#   dist/release-images.txt    one line an image: NAME REGISTRY/NAME:VERSION@sha256:DIGEST, the
#                              references for spec.trainer.image and for pulling back
#
# Docker must be logged in to REGISTRY (for Artifact Registry:
# `gcloud auth configure-docker REGION-docker.pkg.dev`).
#
# Usage: REGISTRY=us-docker.pkg.dev/PROJECT/REPO hack/release.sh [IMAGE...]
#   IMAGE        of build-images.sh's: operator trainer-tpu trainer-cpu (default: all three)
# Environment:
#   REGISTRY     where to push (required)
#   IMAGE_TAG    default the version in pyproject.toml (the chart's appVersion)
#   RELEASE_DIR  default dist, where the two files are written
#   RELEASE_IMAGES  the images, when none are named as arguments
#   BASE_IMAGE   as for build-images.sh: a base to build on instead of the local Debian one
set -euo pipefail
cd "$(dirname "$0")/.."

die() { printf 'release: %s\n' "$*" >&2; exit 1; }

registry=${REGISTRY:-}
[[ -n $registry ]] || die "name the registry: make release REGISTRY=us-docker.pkg.dev/PROJECT/REPO"
registry=${registry%/}
# A place for images (host[:port][/path]), not an image: no tag, no digest.
if [[ $registry =~ [[:space:]@] ]] || [[ $registry == */* && ${registry##*/} == *:* ]]; then
  die "REGISTRY is where images go (host[:port]/path), not an image reference: $registry"
fi
tag=${IMAGE_TAG:-$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n1)}
out=${RELEASE_DIR:-dist}
# The names build-images.sh gives the images it builds.
built_registry=ghcr.io/tpujob

# build-images.sh's image -> the image's name
declare -A names=([operator]=tpujob-operator [trainer-tpu]=tpujob-trainer [trainer-cpu]=tpujob-trainer-cpu)
chosen=("$@")
((${#chosen[@]})) || read -ra chosen <<<"${RELEASE_IMAGES:-}"
((${#chosen[@]})) || chosen=(operator trainer-tpu trainer-cpu)
for image in "${chosen[@]}"; do
  [[ -n ${names[$image]:-} ]] || die "unknown image $image (known: ${!names[*]})"
done

if [[ -n $(git status --porcelain --untracked-files=no -- Dockerfile operator trainer_image requirements pyproject.toml 2>/dev/null) ]]; then
  printf 'release: warning: the images are built from uncommitted changes (git status)\n' >&2
fi
# Built when their inputs changed (and checked then), and checked again whatever: what is pushed
# has just run as its pods run it.
IMAGE_REGISTRY=$built_registry IMAGE_TAG=$tag hack/build-images.sh "${chosen[@]}"
IMAGE_REGISTRY=$built_registry IMAGE_TAG=$tag hack/build-images.sh check "${chosen[@]}"

declare -A pushed=()
for image in "${chosen[@]}"; do
  name=${names[$image]}
  ref=$registry/$name:$tag
  docker tag "$built_registry/$name:$tag" "$ref"
  printf '== pushing %s\n' "$ref" >&2
  log=$(docker push "$ref") || die "the push of $ref failed: $log"
  printf '%s\n' "$log" >&2
  # The push's last line: "TAG: digest: sha256:... size: N".
  digest=$(sed -n 's/.*digest: \(sha256:[0-9a-f]\{64\}\).*/\1/p' <<<"$log" | tail -n1)
  [[ -n $digest ]] || die "the push of $ref printed no digest"
  pushed[$image]=$digest
done

mkdir -p "$out"
{
  for image in "${chosen[@]}"; do
    name=${names[$image]}
    printf '%s %s\n' "$name" "$registry/$name:$tag@${pushed[$image]}"
  done
} >"$out/release-images.txt"
if [[ -n ${pushed[operator]:-} ]]; then
  cat >"$out/values-release.yaml" <<YAML
# The operator image of tpujob $tag as pushed by hack/release.sh, by digest:
#   helm install tpujob-operator charts/tpujob-operator -n tpujob-system --create-namespace \\
#     -f $out/values-release.yaml
# The images pushed with it are listed, by digest, in $out/release-images.txt.
image:
  repository: $registry/tpujob-operator
  tag: "$tag"
  digest: "${pushed[operator]}"
YAML
else
  rm -f "$out/values-release.yaml"  # an earlier release's, which would name another operator
fi
printf '== pushed (%s/release-images.txt):\n' "$out" >&2
cat "$out/release-images.txt"
