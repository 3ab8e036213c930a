#!/usr/bin/env bash
# Builds the project's container images with no container registry (`make images`):
#
#   operator     Dockerfile                            REGISTRY/tpujob-operator:VERSION
#   trainer-cpu  trainer_image/Dockerfile VARIANT=cpu  REGISTRY/tpujob-trainer-cpu:VERSION
#   trainer-tpu  trainer_image/Dockerfile VARIANT=tpu  REGISTRY/tpujob-trainer:VERSION
#
# The base is Debian bookworm (python3 3.11) made here with debootstrap and `docker import`ed, so
# nothing is pulled. Python packages are the ones pinned, with their hashes, in the lockfiles
# (requirements/*.lock, trainer_image/requirements/*.lock): their wheels are downloaded once into
# a wheelhouse, handed to the build in its context, and installed with --no-index, in a build
# run with no network at all. The Dockerfiles themselves still build anywhere with
# `docker build` and their default base, the public python:3.11 slim image pinned by digest
# (they fetch the same hashed wheels from PyPI then).
#
# Everything is cached per machine, by content, under $TPUJOB_IMAGE_CACHE:
#   base/KEY.tar       the base root file system, KEY = hash of the base recipe below
#   wheels/NAME-KEY/   a wheelhouse, KEY = hash of the image's lockfiles
#   context/NAME/      the build context handed to docker, made for each build and removed after
# and an image is rebuilt only when the hash of its inputs changed (the Dockerfile, the lockfiles,
# the source files it copies, the base image and this script), which the image carries as the
# label dev.tpujob.inputs: a second run with nothing changed builds nothing.
#
# Each image built is then checked, run as its pods run it (its own user, a read-only root file
# system, no network): the operator answers --version and `diagnose --help` and holds no
# `tpujob local` (the local cluster and its fault injection, which the operator image leaves
# out); the CPU trainer trains and checkpoints a few steps; the TPU trainer imports jax, libtpu,
# gcsfs and orbax.
#
# Usage:
#   hack/build-images.sh [IMAGE...]        build (default: operator trainer-cpu trainer-tpu)
#   hack/build-images.sh check [IMAGE...]  check the images already built
#   hack/build-images.sh lock              re-resolve the lockfiles (uv; to the versions in .venv)
# Environment:
#   IMAGE_REGISTRY  default ghcr.io/tpujob, the names the chart and the examples use
#   IMAGE_TAG       default the version in pyproject.toml (the chart's appVersion)
#   BASE_IMAGE      a base to use instead of the local Debian one (e.g. the Dockerfiles'
#                   default, python:3.11.14-slim-bookworm@sha256:...)
#   DEBIAN_MIRROR   default http://deb.debian.org/debian
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${TPUJOB_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tpujob/images}
registry=${IMAGE_REGISTRY:-ghcr.io/tpujob}
tag=${IMAGE_TAG:-$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n1)}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
python_version=3.11
uv_version=0.13.8

# The base recipe: everything that decides the base's contents is in this string, and its hash
# names the cached root file system. python3-venv is for the build stages (ensurepip);
# ca-certificates for HTTPS to Cloud Storage and the Kubernetes API.
base_suite=bookworm
base_packages=python3,python3-venv,ca-certificates
base_recipe="debootstrap --variant=minbase --include=$base_packages $base_suite $mirror"

log() { printf '== %s\n' "$*" >&2; }
die() { printf 'build-images: %s\n' "$*" >&2; exit 1; }
sha() { sha256sum | cut -c1-64; }

# name -> "dockerfile|context|image|lockfiles (space separated)|source paths (in the context)|
#          build arguments (space separated)"
declare -A images=(
  [operator]="Dockerfile|.|tpujob-operator|requirements/build.lock requirements/operator.lock|pyproject.toml README.md operator|"
  [trainer-cpu]="trainer_image/Dockerfile|trainer_image|tpujob-trainer-cpu|trainer_image/requirements/build.lock trainer_image/requirements/cpu.lock|pyproject.toml README.md tpujob_trainer|VARIANT=cpu"
  [trainer-tpu]="trainer_image/Dockerfile|trainer_image|tpujob-trainer|trainer_image/requirements/build.lock trainer_image/requirements/tpu.lock|pyproject.toml README.md tpujob_trainer|VARIANT=tpu"
)
default_images=(operator trainer-cpu trainer-tpu)

# What never goes into an image, whatever a source folder holds.
tar_excludes=(--exclude=__pycache__ --exclude='*.pyc' --exclude='*.egg-info' --exclude=build
  --exclude=.mypy_cache --exclude=.ruff_cache --exclude=.pytest_cache)

# A tar of PATHS under DIR that depends only on their names, contents and whether they are
# executable: not on times, owners or the umask of the checkout (which would change the hash,
# and Docker's layer cache, from one clone to the next).
stable_tar() {
  local dir=$1
  shift
  tar -c -C "$dir" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
    --mode=u=rwX,go=rX "${tar_excludes[@]}" "$@"
}

# ---------------------------------------------------------------------------------------------
# lock: resolve each image's dependencies to exact versions with the hashes of their files.

lock() {
  local uv_venv=$cache/tools/uv-$uv_version constraints
  if [[ ! -x $uv_venv/bin/uv ]]; then
    log "installing uv $uv_version"
    python3 -m venv "$uv_venv"
    "$uv_venv/bin/pip" install --quiet "uv==$uv_version"
  fi
  constraints=$(mktemp)
  # The images run what the tests run: resolve to the versions of the development environment
  # (`make venv`) where it has the package, to the newest that fits elsewhere (and always for
  # the build tools, which the tests do not use).
  if [[ -x .venv/bin/python ]]; then
    .venv/bin/python -m pip freeze --exclude-editable 2>/dev/null | grep -v ' @ ' >"$constraints"
  fi
  local common=(--quiet --generate-hashes --no-annotate --python-version "$python_version"
    --python-platform x86_64-manylinux_2_36 --only-binary :all: -c "$constraints"
    --custom-compile-command "hack/build-images.sh lock")
  local uv=$uv_venv/bin/uv
  mkdir -p requirements trainer_image/requirements
  printf 'setuptools>=77\nwheel\n' | "$uv" pip compile - "${common[@]}" -o requirements/build.lock
  cp requirements/build.lock trainer_image/requirements/build.lock
  "$uv" pip compile pyproject.toml --extra gcp "${common[@]}" -o requirements/operator.lock
  "$uv" pip compile trainer_image/pyproject.toml "${common[@]}" -o trainer_image/requirements/cpu.lock
  "$uv" pip compile trainer_image/pyproject.toml --extra tpu "${common[@]}" \
    -o trainer_image/requirements/tpu.lock
  rm -f "$constraints"
  log "lockfiles written"
}

# ---------------------------------------------------------------------------------------------
# The base image.

base_image() {
  if [[ -n ${BASE_IMAGE:-} ]]; then
    docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 || docker pull "$BASE_IMAGE" >&2
    echo "$BASE_IMAGE"
    return
  fi
  local key ref tarball rootfs
  key=$(printf '%s\n' "$base_recipe" | sha)
  ref=tpujob-base:$base_suite-${key:0:12}
  tarball=$cache/base/$key.tar
  if docker image inspect "$ref" >/dev/null 2>&1; then
    log "base $ref: cached image"
  else
    if [[ ! -f $tarball ]]; then
      command -v debootstrap >/dev/null || die "debootstrap is needed: apt-get install debootstrap"
      log "base: $base_recipe"
      mkdir -p "$cache/base"
      rootfs=$(mktemp -d "$cache/base/rootfs.XXXXXX")
      debootstrap --variant=minbase --include="$base_packages" "$base_suite" "$rootfs" "$mirror" \
        >"$cache/base/$key.log" 2>&1 || die "debootstrap failed, see $cache/base/$key.log"
      # What the image never needs at run time: package lists, caches, manuals and
      # translations (each package's copyright file is kept).
      rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/var/log/* \
        "$rootfs"/usr/share/man "$rootfs"/usr/share/info "$rootfs"/usr/share/locale
      find "$rootfs/usr/share/doc" -type f ! -name copyright -delete
      chroot "$rootfs" dpkg-query -W -f '${Package}=${Version}\n' >"$cache/base/$key.packages"
      tar -c -C "$rootfs" --numeric-owner . >"$tarball.tmp"
      mv "$tarball.tmp" "$tarball"
      rm -rf "$rootfs"
    fi
    log "base $ref: importing $tarball"
    docker import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV LANG=C.UTF-8' \
      --change 'CMD ["python3"]' \
      --change "LABEL dev.tpujob.base-recipe=\"$base_recipe\"" \
      "$tarball" "$ref" >/dev/null
  fi
  echo "$ref"
}

# ---------------------------------------------------------------------------------------------
# Wheelhouses: every file of an image's lockfiles, for Linux x86-64 and CPython 3.11.

wheelhouse() {
  local name=$1
  shift
  local key dir platforms=() m
  key=$(cat "$@" | sha)
  dir=$cache/wheels/$name-${key:0:16}
  if [[ -d $dir ]]; then
    log "$name wheels: cached"
    echo "$dir"
    return
  fi
  for ((m = 36; m >= 17; m--)); do platforms+=(--platform "manylinux_2_${m}_x86_64"); done
  platforms+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64
    --platform manylinux1_x86_64)
  log "$name wheels: downloading"
  rm -rf "$dir.tmp"
  mkdir -p "$dir.tmp"
  local reqs=() f
  for f in "$@"; do reqs+=(-r "$f"); done
  python3 -m pip download --quiet --disable-pip-version-check --no-cache-dir --no-deps \
    --require-hashes --only-binary :all: --implementation cp --python-version "$python_version" \
    "${platforms[@]}" "${reqs[@]}" -d "$dir.tmp" >&2
  mv "$dir.tmp" "$dir"
  echo "$dir"
}

# ---------------------------------------------------------------------------------------------
# One image.

build_one() {
  local name=$1 base=$2 spec dockerfile context image locks sources args key ref found wheels ctx
  local arg build_args=()
  spec=${images[$name]:-}
  [[ -n $spec ]] || die "unknown image $name (known: ${!images[*]})"
  IFS='|' read -r dockerfile context image locks sources args <<<"$spec"
  ref=$registry/$image:$tag
  read -ra locks <<<"$locks"
  read -ra sources <<<"$sources"
  read -ra args <<<"$args"
  for arg in "${args[@]}"; do build_args+=(--build-arg "$arg"); done

  # The inputs, hashed: the base (by image id), the tag, the build arguments, this script, the
  # Dockerfile, the lockfiles and the sources, by content.
  key=$( {
    docker image inspect -f '{{.Id}}' "$base"
    echo "$ref"
    echo "${args[*]}"
    cat "$0"
    stable_tar . "$dockerfile" "${locks[@]}" "${sources[@]/#/$context/}"
  } | sha)

  if [[ $(docker image inspect -f '{{index .Config.Labels "dev.tpujob.inputs"}}' "$ref" 2>/dev/null) == "$key" ]]; then
    log "$ref: up to date"
    return
  fi
  built+=("$name")
  found=$(docker image ls -q --filter "label=dev.tpujob.inputs=$key" | head -n1)
  if [[ -n $found ]]; then
    log "$ref: tagging the image already built from these inputs"
    docker tag "$found" "$ref"
    return
  fi

  wheels=$(wheelhouse "$name" "${locks[@]}")
  # The context holds what the Dockerfile copies and the wheelhouse as .wheels/; docker gets it
  # whole, so it is made of exactly these files.
  ctx=$cache/context/$name
  rm -rf "$ctx"
  mkdir -p "$ctx"
  stable_tar "$context" "${sources[@]}" "${locks[@]#"$context"/}" | tar -x -C "$ctx"
  cp "$dockerfile" "$ctx/Dockerfile"
  cp -al "$wheels" "$ctx/.wheels" 2>/dev/null || cp -a "$wheels" "$ctx/.wheels"

  log "$ref: building"
  docker build --network none --build-arg "BASE_IMAGE=$base" "${build_args[@]}" \
    --label "dev.tpujob.inputs=$key" -t "$ref" "$ctx" >&2
  rm -rf "$ctx"
}

# ---------------------------------------------------------------------------------------------
# Checks: each image run as its pods run it.

check_one() {
  local name=$1 image ref out run=(docker run --rm --read-only --tmpfs /tmp --network none)
  [[ -n ${images[$name]:-} ]] || die "unknown image $name (known: ${!images[*]})"
  IFS='|' read -r _ _ image _ <<<"${images[$name]}"
  ref=$registry/$image:$tag
  log "$ref: checking"
  case $name in
    operator)
      "${run[@]}" "$ref" --version >&2 || die "$ref: tpujob --version failed"
      "${run[@]}" "$ref" diagnose --help >/dev/null || die "$ref: tpujob diagnose --help failed"
      if "${run[@]}" --entrypoint python "$ref" -c 'import tpujob.local' 2>/dev/null; then
        die "$ref: holds tpujob.local, which the operator image leaves out"
      fi
      if out=$("${run[@]}" "$ref" local up 2>&1) || [[ $out != *"not in this build"* ]]; then
        die "$ref: \`tpujob local\` does not say it is not in this build: $out"
      fi
      ;;
    trainer-cpu)
      out=$("${run[@]}" --tmpfs /ckpt:uid=1000,gid=1000 "$ref" --steps 20 --batch-size 32 \
        --log-every 10 --checkpoint-dir /ckpt --checkpoint-interval 10 2>&1) \
        || die "$ref: the trainer failed: $out"
      [[ $out == *"checkpoint step 20 committed"* ]] || die "$ref: no checkpoint at step 20: $out"
      ;;
    trainer-tpu)
      "${run[@]}" --entrypoint python "$ref" \
        -c 'import jax, libtpu, gcsfs, orbax.checkpoint, tpujob_trainer' \
        || die "$ref: the trainer's packages do not import"
      ;;
  esac
}

main() {
  if [[ ${1:-} == lock ]]; then
    lock
    return
  fi
  command -v docker >/dev/null || die "docker is needed"
  docker info >/dev/null 2>&1 || die "the Docker daemon is not running"
  local names base name built=()
  if [[ ${1:-} == check ]]; then
    shift
    names=("$@")
    ((${#names[@]})) || names=("${default_images[@]}")
    for name in "${names[@]}"; do check_one "$name"; done
    return
  fi
  names=("$@")
  ((${#names[@]})) || names=("${default_images[@]}")
  base=$(base_image)
  for name in "${names[@]}"; do build_one "$name" "$base"; done
  for name in "${built[@]}"; do check_one "$name"; done
  for name in "${names[@]}"; do
    IFS='|' read -r _ _ image _ <<<"${images[$name]}"
    docker image ls --format '{{.Repository}}:{{.Tag}}  {{.ID}}  {{.Size}}' "$registry/$image:$tag"
  done
}

main "$@"
