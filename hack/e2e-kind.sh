#!/usr/bin/env bash
# End to end on kind, for machines with Docker (`make e2e-kind`): create the cluster of
# kind-config.yaml, build and load the images, install the chart, then run two CPU-backed jobs
# through real faults on real kubelets:
# - a multislice job (hack/kind-multislice-job.yaml) whose trainer container in one pod of
#   slice 1 is SIGKILLed whole: its container restart rule starts it again in its pod, and both
#   slices' trainers rejoin in place, no pod replaced;
# - a one-slice job (hack/kind-job.yaml) whose trainer in one pod is SIGKILLed (a soft restart)
#   and then the Docker container of a node running one of its pods is stopped (a hard failure:
#   the node marked bad, the slice moved to the other node pool).
# Each must end Succeeded. It prints each job's `tpujob describe` (progress, restarts,
# timeline), as `make demo` does.
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
multislice=kind-multislice
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
    for name in "$multislice" "$job"; do describe "$name" || true; done
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

# The job's field at a JSONPath, for wait_until.
field() { kubectl get "tpujob/$1" -o jsonpath="{$2}"; }

describe() {
  step "tpujob describe $1"
  PYTHONPATH=operator .venv/bin/python -m tpujob.cli describe "$1" -n default
}

# SIGKILLs the main process of a pod's trainer container from its node, as a crash would:
# the container's PID 1 cannot be killed from inside its own PID namespace.
kill_trainer() {
  local pod=$1 node cid pid
  node=$(kubectl get pod "$pod" -o jsonpath='{.spec.nodeName}')
  cid=$(docker exec "$node" crictl ps -q --state running \
    --label "io.kubernetes.pod.name=$pod" --label io.kubernetes.pod.namespace=default |
    head -n1)
  [[ -n $cid ]] || { echo "pod $pod has no running container on $node" >&2; return 1; }
  pid=$(docker exec "$node" crictl inspect -o go-template --template '{{.info.pid}}' "$cid")
  echo "killing the trainer of $pod on $node (pid $pid)"
  docker exec "$node" kill -KILL "$pid"
}

# How many times a job's timeline says training resumed after a restart.
resumed() { field "$1" '.status.timeline[?(@.kind=="Resumed")].kind' | wc -w; }

# Waits until a job runs and has reported training at least this step.
wait_training() {
  wait_until = Running 600 "phase of $1" field "$1" .status.phase
  wait_until -ge "$2" 600 "training step of $1" field "$1" .status.progress.step
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

step "run the multislice job $multislice; kill a trainer container of slice 1"
kubectl apply -f hack/kind-multislice-job.yaml
wait_training "$multislice" 10
kill_trainer "$multislice-1-1-0"
wait_until -ge 1 600 "soft restarts of $multislice" field "$multislice" .status.restarts.soft
# The killed container restarts in its pod (exit 137, its restart rule): every pod stays.
wait_until = "0 1" 120 "slices of $multislice kept in place" \
  field "$multislice" '.status.currentAttempt.keptSlices[*].slice'
wait_until = Succeeded 1200 "phase of $multislice" field "$multislice" .status.phase
describe "$multislice"

step "run job $job; kill one of its trainers"
kubectl apply -f hack/kind-job.yaml
wait_training "$job" 10
kill_trainer "$job-1-0-1"
wait_until -ge 1 600 "soft restarts of $job" field "$job" .status.restarts.soft
wait_until -ge 1 600 "training resumed by $job" resumed "$job"

step "stop the node container of one trainer pod of $job (not the operator's node)"
operator_node=$(kubectl -n tpujob-system get pods -l app.kubernetes.io/name=tpujob-operator \
  -o jsonpath='{.items[0].spec.nodeName}')
victim=$(kubectl get pods -l "tpujob.dev/job=$job" --field-selector=status.phase=Running \
  -o jsonpath='{.items[*].spec.nodeName}' | tr ' ' '\n' | grep -vx "$operator_node" | head -n1 || true)
[[ -n $victim ]] || { echo "found no trainer pod of $job to fail" >&2; exit 1; }
echo "stopping $victim"
docker stop "$victim"

step "wait for the hard-failure recovery and the end of training"
wait_until -ge 1 600 "hard restarts of $job" field "$job" .status.restarts.hard
wait_until = Succeeded 1200 "phase of $job" field "$job" .status.phase
describe "$job"
echo "e2e-kind passed: $multislice through a container restarted in its pod; $job through a killed trainer and the loss of $victim"
