#!/usr/bin/env bash
# End to end on kind, for machines with Docker (`make e2e-kind`): create the cluster of
# kind-config.yaml, build and load the images, install the chart, run a CPU-backed job, stop
# the Docker container of a node running one of its trainer pods, and wait for the operator to
# diagnose the hard failure, move the slice to the other node pool, and finish the job.
# It ends with the job's `tpujob describe` (progress, restarts, timeline), as `make demo` does.
# Docker (and debootstrap) come from the distribution's packages when missing and the daemon is
# started when it is not running (hack/ensure-docker.sh); kind, its node image
# (hack/kind-node-image.sh), kubectl and helm are built from the Go modules pinned under tools/,
# and the virtual environment made, when missing. KEEP=1 leaves the cluster up afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."

hack/ensure-docker.sh
make -s venv
node_image=$(hack/kind-node-image.sh | tail -n1)
cache=${TPUJOB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tpujob}
kind_version=$(awk '$1 == "require" && $2 == "sigs.k8s.io/kind" {print $3}' tools/kind/go.mod)
# tools/kind/privileged first: kind's docker, for hosts whose capability bounding set is incomplete.
PATH="$PWD/tools/kind/privileged:$cache/kind/bin/kind-$kind_version:$(tools/build-control-plane.sh | tail -n1):$PATH"

cluster=${CLUSTER:-tpujob-e2e}
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n1)
operator_image=ghcr.io/tpujob/tpujob-operator:$version
trainer_image=ghcr.io/tpujob/tpujob-trainer-cpu:$version
job=kind-e2e
chips_per_host=4
export KUBECONFIG
KUBECONFIG=$(mktemp)

step() { printf '\n== %s\n' "$*"; }

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "e2e-kind needs $tool on PATH" >&2; exit 1; }
done

finish() {
  local status=$?
  if [[ $status -ne 0 ]]; then
    step "failed; cluster state"
    kubectl get tpujobs,pods,nodes -A -o wide || true
    kubectl -n tpujob-system logs deployment/tpujob-operator --tail=100 || true
  fi
  if [[ ${KEEP:-0} == 1 ]]; then
    echo "cluster $cluster kept; KUBECONFIG=$KUBECONFIG"
  else
    kind delete cluster --name "$cluster" || true
    rm -f "$KUBECONFIG"
  fi
  exit "$status"
}
trap finish EXIT

# Polls until a command's output passes a test: `-ge N` (a number at least N) or `= TEXT`.
# `kubectl wait` is not used on the job: it cannot compare numbers, and on a freshly created
# object `--for=jsonpath` can fail at once because the field does not exist yet.
wait_until() {
  local op=$1 want=$2 timeout=$3 what=$4 got
  shift 4
  for ((waited = 0; waited < timeout; waited += 5)); do
    got=$("$@" || true)
    if [[ $op == -ge && ${got:-0} -ge $want ]] || [[ $op == = && $got == "$want" ]]; then
      return 0
    fi
    sleep 5
  done
  echo "timed out after ${timeout}s waiting for $what $op $want (last: ${got:-none})" >&2
  return 1
}

step "create kind cluster $cluster"
kind create cluster --name "$cluster" --config kind-config.yaml --kubeconfig "$KUBECONFIG" \
  --image "$node_image" --wait 300s

step "build and load images"
IMAGE_TAG=$version hack/build-images.sh operator trainer-cpu
kind load docker-image --name "$cluster" "$operator_image" "$trainer_image"

step "advertise $chips_per_host google.com/tpu on each TPU worker (kind nodes have none)"
tpu="\"google.com/tpu\":\"$chips_per_host\""
for node in $(kubectl get nodes -l cloud.google.com/gke-tpu-accelerator -o name); do
  kubectl patch "$node" --subresource=status --type=merge \
    -p "{\"status\":{\"capacity\":{$tpu},\"allocatable\":{$tpu}}}"
done

step "install the operator chart"
kubectl apply --server-side -f charts/tpujob-operator/crds/
helm install tpujob-operator charts/tpujob-operator --namespace tpujob-system --create-namespace \
  --set image.tag="$version" --set image.pullPolicy=Never --wait --timeout 5m

step "run job $job and wait until it trains"
kubectl apply -f hack/kind-job.yaml
wait_until = Running 600 "phase" kubectl get "tpujob/$job" -o jsonpath='{.status.phase}'
wait_until -ge 10 300 "training step" \
  kubectl get "tpujob/$job" -o jsonpath='{.status.progress.step}'

step "stop the node container of one trainer pod (not the operator's node)"
operator_node=$(kubectl -n tpujob-system get pods -l app.kubernetes.io/name=tpujob-operator \
  -o jsonpath='{.items[0].spec.nodeName}')
victim=$(kubectl get pods -l "tpujob.dev/job=$job" -o jsonpath='{.items[*].spec.nodeName}' |
  tr ' ' '\n' | grep -vx "$operator_node" | head -n1 || true)
[[ -n $victim ]] || { echo "found no trainer pod of $job to fail" >&2; exit 1; }
echo "stopping $victim"
docker stop "$victim"

step "wait for the hard-failure recovery and the end of training"
wait_until -ge 1 600 "hard restarts" \
  kubectl get "tpujob/$job" -o jsonpath='{.status.restarts.hard}'
wait_until = Running 600 "phase" kubectl get "tpujob/$job" -o jsonpath='{.status.phase}'
wait_until = Succeeded 1200 "phase" kubectl get "tpujob/$job" -o jsonpath='{.status.phase}'
step "tpujob describe $job"
PYTHONPATH=operator .venv/bin/python -m tpujob.cli describe "$job" -n default
echo "e2e-kind passed: $job recovered from losing $victim and succeeded"
