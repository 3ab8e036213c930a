#!/usr/bin/env bash
# Makes Docker usable for `make e2e-kind` and `make kind-node-image`: installs Docker and
# debootstrap from the distribution's packages when missing (Debian's docker.io: dockerd,
# containerd, runc), and starts the daemon when it is not answering, detached, logging to
# $TPUJOB_CACHE/dockerd.log. A daemon already running is left as it is. Needs root and apt.
#
# Decision: the distribution's docker.io, not Docker's own repository, so nothing but the
# distribution's mirror is needed; kind and the images here work with its Docker 20.10.
# Starting the daemon sets the FORWARD chain's policy to DROP; the local cluster copes with that
# (tests/e2e/test_forward_policy.py). `ensure-docker.sh stop` stops a daemon this script started
# and sets FORWARD back to ACCEPT.
set -euo pipefail

cache=${TPUJOB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tpujob}
pid_file=$cache/dockerd.pid

if [[ ${1:-} == stop ]]; then
  if [[ -f $pid_file ]] && kill "$(cat "$pid_file")" 2>/dev/null; then
    for _ in $(seq 60); do kill -0 "$(cat "$pid_file")" 2>/dev/null || break; sleep 1; done
    rm -f "$pid_file"
    iptables -P FORWARD ACCEPT
    echo "dockerd stopped" >&2
  fi
  exit 0
fi

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "installing ${missing[*]} from the distribution's packages" >&2
  # Another apt run (make system-deps, say) may hold the lock: wait for it rather than fail.
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    "${missing[@]}" >/dev/null
fi

if docker info >/dev/null 2>&1; then exit 0; fi
mkdir -p "$cache"
echo "starting dockerd (log: $cache/dockerd.log)" >&2
setsid dockerd >"$cache/dockerd.log" 2>&1 </dev/null &
echo $! >"$pid_file"
for _ in $(seq 60); do
  docker info >/dev/null 2>&1 && exit 0
  kill -0 "$(cat "$pid_file")" 2>/dev/null || break
  sleep 1
done
echo "dockerd did not come up; see $cache/dockerd.log" >&2
exit 1
