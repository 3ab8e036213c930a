#!/usr/bin/env bash
# Builds the kind node image that `make e2e-kind` runs (`make kind-node-image`), and kind itself,
# with no container registry: every image from Debian packages and Go modules.
#
# Decision: our own node image, not `kind build node-image`. kind's builder starts from its own
# base image (pulled) and pulls the images it does not find in the Kubernetes tarball; here
# every piece is made locally, so the script assembles the node directly, in four steps:
#
#   1. Go binaries from the modules pinned under tools/ (CGO_ENABLED=0, GOTOOLCHAIN=local):
#      kubelet, kubeadm, kube-proxy, kubectl, kube-apiserver, kube-controller-manager,
#      kube-scheduler (tools/k8s), etcd (tools/etcd), kind, pause (tools/kind), CoreDNS
#      (tools/kind/coredns), crictl (tools/kind/cri-tools), the CNI plugins ptp, bridge,
#      loopback, host-local and portmap (tools/kind/cni), local-path-provisioner
#      (tools/kind/local-path).
#   2. Two Debian bookworm root file systems made with debootstrap: the node's (systemd,
#      containerd and runc from Debian's packages) and a small one for the images that need a
#      shell or iptables (kube-proxy, the pod network agent, the local-path helper).
#   3. The cluster's container images, built with `docker build --network none` from those
#      binaries: the control plane's under the exact names `kubeadm config images list` prints,
#      so kubeadm and the kubelet find every one of them and never pull.
#   4. The node: its root file system plus tools/kind/node/files and the binaries; containerd is
#      started once inside it to import the images into its content store (not unpacked: /var is
#      a volume in a kind node, and containerd unpacks a layer on first use), then committed.
#
# kind's own CNI (kindnetd) is not published as a Go module, so the node image ships its own
# pod network in its place (tools/kind/node/files/kind/manifests/default-cni.yaml): a DaemonSet
# that gives each node a ptp + host-local CNI config for its podCIDR and routes to the other
# nodes' podCIDRs. Everything else is what kind expects of a node image (/kind/version,
# /kind/manifests/default-{cni,storage}.yaml, systemd as PID 1, containerd's socket).
#
# cgroup v1: Kubernetes 1.35 and later refuse to start the kubelet on a cgroup v1 host unless
# its configuration says failCgroupV1: false. The node image's kubelet reads the drop-in
# /etc/kubernetes/kubelet.conf.d/50-cgroup-v1.conf, which says it, whatever kind's kubeadm
# configuration is; on a cgroup v2 host it changes nothing.
#
# Everything is cached per machine, keyed by versions, under $TPUJOB_CACHE/kind
# (default ${XDG_CACHE_HOME:-$HOME/.cache}/tpujob/kind):
#   bin/NAME-VERSION/      the Go binaries, one folder per pinned version
#   rootfs/KEY.tar         a root file system, KEY = hash of its debootstrap recipe
#   images-KEY.tar         the cluster's images as one `docker save` archive
# and the images in Docker are tagged by the hash of their inputs: a second run with nothing
# changed builds nothing. The node image's name is printed on the last line.
#
# kind runs nodes with --privileged, which Docker before 23 cannot do where the host's capability
# bounding set is incomplete: tools/kind/privileged/docker, first on PATH for kind, stands in
# there (docs/kind.md).
#
# Usage: hack/kind-node-image.sh [binaries | rootfs]   (only step 1, or only the root file systems)
# Environment: TPUJOB_CACHE, DEBIAN_MIRROR (default http://deb.debian.org/debian),
#              KIND_NODE_IMAGE (default tpujob.dev/kind-node:KUBERNETES_VERSION-KEY)
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

cache=${TPUJOB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tpujob}/kind
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm

log() { printf '== %s\n' "$*" >&2; }
die() { printf 'kind-node-image: %s\n' "$*" >&2; exit 1; }
sha() { sha256sum | cut -c1-64; }
pinned() { awk -v m="$2" '$1 == "require" && $2 == m {print $3}' "$1/go.mod"; }

k8s_version=$(pinned tools/k8s k8s.io/kubernetes)
kind_version=$(pinned tools/kind sigs.k8s.io/kind)
coredns_version=$(pinned tools/kind/coredns github.com/coredns/coredns)
crictl_version=$(pinned tools/kind/cri-tools sigs.k8s.io/cri-tools)
cni_version=$(pinned tools/kind/cni github.com/containernetworking/plugins)
local_path_version=$(pinned tools/kind/local-path github.com/rancher/local-path-provisioner)
pause_key=$(cat tools/kind/go.mod tools/kind/pause/main.go | sha)

export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS="-mod=mod -trimpath"

# go_build DIR OUT PACKAGE... [-- LDFLAGS]: build PACKAGES of the module in DIR into OUT, unless
# every command is there already. A folder is complete once it is renamed from OUT.partial.
go_build() {
  local dir=$1 out=$2 ld="-s -w" pkgs=()
  shift 2
  while (($#)); do
    if [[ $1 == -- ]]; then ld="$ld $2"; break; fi
    pkgs+=("$1")
    shift
  done
  [[ -d $out ]] && return
  log "building ${pkgs[*]##*/} into $out"
  local start=$SECONDS
  rm -rf "$out.partial"
  mkdir -p "$out.partial"
  (cd "$dir" && nice -n 15 go build -ldflags "$ld" -o "$out.partial/" "${pkgs[@]}")
  mv "$out.partial" "$out"
  log "built in $((SECONDS - start))s"
}

binaries() {
  local b=$cache/bin k8s_ld
  k8s_ld="-X k8s.io/component-base/version.gitVersion=$k8s_version"
  k8s_ld="$k8s_ld -X k8s.io/component-base/version.gitMajor=1"
  k8s_ld="$k8s_ld -X k8s.io/component-base/version.gitMinor=$(echo "$k8s_version" | cut -d. -f2)"
  k8s_ld="$k8s_ld -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version"
  # The control plane's binaries and etcd are the local cluster's, built once for both.
  control_plane=$(tools/build-control-plane.sh | tail -n1)
  go_build tools/k8s "$b/k8s-node-$k8s_version" k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kubeadm k8s.io/kubernetes/cmd/kube-proxy -- "$k8s_ld"
  go_build tools/kind "$b/kind-$kind_version" sigs.k8s.io/kind
  go_build tools/kind "$b/pause-${pause_key:0:12}" ./pause
  go_build tools/kind/cri-tools "$b/crictl-$crictl_version" sigs.k8s.io/cri-tools/cmd/crictl \
    -- "-X sigs.k8s.io/cri-tools/pkg/version.Version=$crictl_version"
  go_build tools/kind/cni "$b/cni-plugins-$cni_version" \
    github.com/containernetworking/plugins/plugins/main/{ptp,bridge,loopback} \
    github.com/containernetworking/plugins/plugins/ipam/host-local \
    github.com/containernetworking/plugins/plugins/meta/portmap
  go_build tools/kind/local-path "$b/local-path-provisioner-$local_path_version" \
    github.com/rancher/local-path-provisioner
  go_build tools/kind/coredns "$b/coredns-$coredns_version" github.com/coredns/coredns \
    -- "-X github.com/coredns/coredns/coremain.GitCommit=$coredns_version"
}

# The root file systems: everything that decides one's contents is in its recipe, and the
# recipe's hash names the cached tar.
node_packages=systemd,systemd-sysv,dbus,containerd,runc,iptables,iproute2,conntrack,kmod,procps
node_packages=$node_packages,ca-certificates,libseccomp2,ethtool,socat,util-linux,mount
tools_packages=iptables,iproute2,conntrack,ca-certificates
recipe() { echo "debootstrap --variant=minbase --include=$1 $suite $mirror"; }

# rootfs PACKAGES: prints the path of the tar of a minbase root file system with PACKAGES.
rootfs() {
  local packages=$1 key tarball dir
  key=$(recipe "$packages" | sha)
  tarball=$cache/rootfs/$key.tar
  if [[ ! -f $tarball ]]; then
    command -v debootstrap >/dev/null || die "debootstrap is needed: apt-get install debootstrap"
    log "root file system: $(recipe "$packages")"
    mkdir -p "$cache/rootfs"
    dir=$(mktemp -d "$cache/rootfs/tmp.XXXXXX")
    nice -n 15 debootstrap --variant=minbase --include="$packages" "$suite" "$dir" "$mirror" \
      >"$cache/rootfs/$key.log" 2>&1 || die "debootstrap failed, see $cache/rootfs/$key.log"
    # Package lists, caches, manuals and translations are never needed (copyrights are kept).
    rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/* "$dir"/var/log/* \
      "$dir"/usr/share/man "$dir"/usr/share/info "$dir"/usr/share/locale
    find "$dir/usr/share/doc" -type f ! -name copyright -delete
    chroot "$dir" dpkg-query -W -f '${Package}=${Version}\n' >"$cache/rootfs/$key.packages"
    tar -c -C "$dir" --numeric-owner . >"$tarball.tmp"
    mv "$tarball.tmp" "$tarball"
    rm -rf "$dir"
  fi
  echo "$tarball"
}

# ---------------------------------------------------------------------------------------------
# The cluster's images.

# build_image REF CONTEXT KEY: docker build CONTEXT (a folder holding a Dockerfile and root/) as
# REF, unless REF is already the image of inputs KEY; then the context is removed.
build_image() {
  local ref=$1 ctx=$2 key=$3
  if [[ $(docker image inspect -f '{{index .Config.Labels "dev.tpujob.inputs"}}' "$ref" 2>/dev/null) != "$key" ]]; then
    log "$ref: building"
    # Quiet when it works (the legacy builder's deprecation notice included), all when not.
    local out
    out=$(docker build -q --network none --label "dev.tpujob.inputs=$key" -t "$ref" "$ctx" 2>&1) ||
      { printf '%s\n' "$out" >&2; die "building $ref failed"; }
  fi
  rm -rf "$ctx"
}

# new_context NAME: an empty build context with a root/ holding the bare minimum of a Linux
# image (users, groups, /tmp); prints its path.
new_context() {
  local ctx=$cache/context/$1
  rm -rf "$ctx"
  mkdir -p "$ctx/root/etc" "$ctx/root/tmp"
  chmod 1777 "$ctx/root/tmp"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' \
    >"$ctx/root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$ctx/root/etc/group"
  echo "$ctx"
}

# context_key CONTEXT: the hash of a context's contents (names, modes and bytes).
context_key() {
  tar -c -C "$1" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 . | sha
}

# image FROM REF ENTRYPOINT FILE=DEST...: an image of FROM (scratch or a local image) with each
# FILE copied to DEST (absolute) and ENTRYPOINT (a JSON array, or "" for none or FROM's).
image() {
  local from=$1 ref=$2 entry=$3 ctx spec key
  shift 3
  ctx=$(new_context "${ref//[\/:]/_}")
  if [[ $from != scratch ]]; then rm -rf "$ctx/root/etc" "$ctx/root/tmp"; fi
  for spec in "$@"; do
    mkdir -p "$ctx/root$(dirname "${spec#*=}")"
    cp -a "${spec%%=*}" "$ctx/root${spec#*=}"
  done
  {
    echo "FROM $from"
    echo "COPY root/ /"
    echo "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    if [[ -n $entry ]]; then echo "ENTRYPOINT $entry"; fi
  } >"$ctx/Dockerfile"
  if [[ $from != scratch ]]; then
    key=$( (docker image inspect -f '{{.Id}}' "$from"; context_key "$ctx") | sha)
  else
    key=$(context_key "$ctx")
  fi
  build_image "$ref" "$ctx" "$key"
}

# import_rootfs TAR REF: `docker import` a root file system tar as REF, once.
import_rootfs() {
  if ! docker image inspect "$2" >/dev/null 2>&1; then
    log "$2: importing $1"
    docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      "$1" "$2" >/dev/null
  fi
}

# cluster_images: builds every image a node runs; sets images (the refs to preload) and the
# refs the node's files name (pause_image, network_image, provisioner_image, helper_image).
cluster_images() {
  local b=$cache/bin tools_tar tools ref name list
  tools_tar=$(rootfs "$tools_packages")
  tools=tpujob.dev/kind-tools:$suite-$(basename "$tools_tar" .tar | cut -c1-12)
  import_rootfs "$tools_tar" "$tools"
  images=()
  # The control plane's images, by the names kubeadm asks for. etcd and CoreDNS are the versions
  # pinned under tools/ under the tags kubeadm expects (docs/kind.md).
  list=$("$b/k8s-node-$k8s_version/kubeadm" config images list --kubernetes-version "$k8s_version" 2>/dev/null)
  for ref in $list; do
    name=${ref##*/}
    name=${name%%:*}
    case $name in
      kube-apiserver | kube-controller-manager | kube-scheduler)
        image scratch "$ref" "" "$control_plane/$name=/usr/local/bin/$name" ;;
      kube-proxy)
        image "$tools" "$ref" "" "$b/k8s-node-$k8s_version/kube-proxy=/usr/local/bin/kube-proxy" ;;
      etcd)
        image scratch "$ref" "" "$control_plane/etcd=/usr/local/bin/etcd" ;;
      coredns)
        image scratch "$ref" '["/coredns"]' "$b/coredns-$coredns_version/coredns=/coredns" ;;
      pause)
        pause_image=$ref
        image scratch "$ref" '["/pause"]' "$b/pause-${pause_key:0:12}/pause=/pause" ;;
      *) die "kubeadm asks for an image this script does not build: $ref" ;;
    esac
    images+=("$ref")
  done
  [[ -n ${pause_image:-} ]] || die "kubeadm listed no images"
  network_image=tpujob.dev/kind-pod-network:$(sha <tools/kind/pod-network/pod-network.sh | cut -c1-12)
  image "$tools" "$network_image" "" \
    "tools/kind/pod-network/pod-network.sh=/usr/local/bin/pod-network.sh" \
    "$control_plane/kubectl=/usr/local/bin/kubectl"
  provisioner_image=tpujob.dev/local-path-provisioner:$local_path_version
  image scratch "$provisioner_image" '["/usr/local/bin/local-path-provisioner"]' \
    "$b/local-path-provisioner-$local_path_version/local-path-provisioner=/usr/local/bin/local-path-provisioner"
  helper_image=$tools
  images+=("$network_image" "$provisioner_image" "$helper_image")
}

# ---------------------------------------------------------------------------------------------
# The node.

node_image() {
  local b=$cache/bin node_tar base ctx key ref archive f container
  node_tar=$(rootfs "$node_packages")
  base=tpujob.dev/kind-node-base:$suite-$(basename "$node_tar" .tar | cut -c1-12)
  import_rootfs "$node_tar" "$base"

  ctx=$(new_context node)
  rm -rf "$ctx/root"
  mkdir -p "$ctx/root/usr/bin" "$ctx/root/usr/local/bin" "$ctx/root/opt/cni/bin"
  cp -a tools/kind/node/files/. "$ctx/root/"
  cp -a "$b/k8s-node-$k8s_version/kubelet" "$b/k8s-node-$k8s_version/kubeadm" \
    "$control_plane/kubectl" "$ctx/root/usr/bin/"
  cp -a "$b/crictl-$crictl_version/crictl" "$ctx/root/usr/local/bin/"
  cp -a "$b/cni-plugins-$cni_version/." "$ctx/root/opt/cni/bin/"
  echo "$k8s_version" >"$ctx/root/kind/version"
  for f in etc/containerd/config.toml kind/manifests/default-cni.yaml \
    kind/manifests/default-storage.yaml; do
    sed -i -e "s|@PAUSE_IMAGE@|$pause_image|" -e "s|@NETWORK_IMAGE@|$network_image|" \
      -e "s|@PROVISIONER_IMAGE@|$provisioner_image|" -e "s|@HELPER_IMAGE@|$helper_image|" \
      "$ctx/root/$f"
  done
  # Units a container has no use for are masked; each node makes its own machine id at start.
  printf '%s\n' "FROM $base" "COPY root/ /" \
    "RUN systemctl enable containerd.service kubelet.service \\" \
    " && systemctl mask getty.target console-getty.service systemd-udevd.service \\" \
    "      systemd-modules-load.service systemd-remount-fs.service apt-daily.timer \\" \
    "      apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer e2scrub_reap.service \\" \
    " && systemctl set-default multi-user.target \\" \
    " && : >/etc/machine-id && ln -sf /etc/machine-id /var/lib/dbus/machine-id" \
    "ENV container=docker" "STOPSIGNAL SIGRTMIN+3" >"$ctx/Dockerfile"
  # The node's name: the Kubernetes version and the hash of every input (this script, the base,
  # the files, the binaries, and the images to preload, by id).
  key=$( {
    cat "$0"
    docker image inspect -f '{{.Id}}' "$base"
    context_key "$ctx"
    for ref in "${images[@]}"; do echo "$ref"; docker image inspect -f '{{.Id}}' "$ref"; done
  } | sha)
  ref=${KIND_NODE_IMAGE:-tpujob.dev/kind-node:$k8s_version-${key:0:12}}
  if [[ $(docker image inspect -f '{{index .Config.Labels "dev.tpujob.inputs"}}' "$ref" 2>/dev/null) == "$key" ]]; then
    log "$ref: up to date"
    rm -rf "$ctx"
    echo "$ref"
    return
  fi
  build_image "$ref-stage" "$ctx" "$key"

  # Preload: containerd, started once in the node, imports every image into its content store.
  log "$ref: preloading ${#images[@]} images"
  archive=$cache/images-${key:0:12}.tar
  docker save "${images[@]}" >"$archive"
  container=tpujob-kind-node-build-${key:0:12}
  docker rm -f "$container" >/dev/null 2>&1 || true
  docker run --name "$container" --network none --entrypoint /bin/bash \
    -v "$archive:/images.tar:ro" "$ref-stage" -euc '
      mkdir -p /run/containerd
      containerd >/tmp/containerd.log 2>&1 &
      for _ in $(seq 100); do ctr version >/dev/null 2>&1 && break; sleep 0.2; done
      ctr --namespace=k8s.io images import --all-platforms --no-unpack --digests /images.tar >/dev/null
      ctr --namespace=k8s.io images list -q | grep -v "^sha256:\|^import-" | sort
      kill %1
      wait || true
      rm -rf /tmp/* /run/containerd' >&2
  docker commit \
    --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' \
    --change 'CMD []' \
    --change "LABEL dev.tpujob.inputs=$key" \
    "$container" "$ref" >/dev/null
  docker rm "$container" >/dev/null
  docker rmi "$ref-stage" >/dev/null
  rm -f "$archive"
  # Node images of earlier inputs are over a gigabyte each: remove those no container uses.
  local old
  for old in $(docker image ls --format '{{.Repository}}:{{.Tag}}' tpujob.dev/kind-node); do
    [[ $old == "$ref" ]] || docker rmi "$old" >/dev/null 2>&1 || true
  done
  echo "$ref"
}

main() {
  case ${1:-} in
    binaries) binaries; echo "$cache/bin"; return ;;
    rootfs) rootfs "$node_packages"; rootfs "$tools_packages"; return ;;
  esac
  command -v docker >/dev/null || die "docker is needed"
  docker info >/dev/null 2>&1 || die "the Docker daemon is not running"
  local start=$SECONDS ref
  binaries
  cluster_images
  ref=$(node_image)
  log "done in $((SECONDS - start))s; kind is $cache/bin/kind-$kind_version/kind"
  echo "$ref"
}

main "$@"
