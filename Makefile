# tpujob: the two commands a new user needs are `make demo` and `make test`.
# Both create the virtual environment and build the local cluster's binaries when missing.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: all system-deps venv binaries generate check-generated lint unit trainer-tests cluster-tests test suite demo bench bench-scale bench-goodput bench-soak crash-drill e2e-kind clean diagnosis-model

all: test

$(STAMP): pyproject.toml trainer_image/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]" -e ./trainer_image
	touch $(STAMP)

venv: $(STAMP)

# The local cluster runs pods in their own network and mount namespaces (iproute2, bubblewrap)
# and lets its bridge's traffic through the FORWARD chain whatever its policy (iptables, either
# backend), from the distribution's packages, installed when missing.
system-deps:
	@command -v bwrap >/dev/null && command -v ip >/dev/null && command -v iptables >/dev/null || \
	  (apt-get update -qq && apt-get install -y -qq bubblewrap iproute2 iptables >/dev/null)

# Builds etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl and helm from
# the Go modules pinned under tools/, and fake-gcs-server for the gs:// checkpoint tests (once
# per machine; later runs reuse the cache).
binaries: system-deps
	tools/build-control-plane.sh
	tools/build-fake-gcs.sh

# The one command that writes generated artefacts: the CRD (from the pydantic models), the
# chart's copy of it, the topology and metrics pages, and the operator's copy of the trainer
# contract.
generate: venv
	$(PY) -m tpujob.crdgen write
	cp trainer_image/tpujob_trainer/contract.py operator/tpujob/api/contract.py

lint: venv
	$(VENV)/bin/ruff check operator trainer_image tests bench
	$(VENV)/bin/ruff format --check operator trainer_image tests bench
	$(VENV)/bin/mypy
	cd trainer_image && ../$(VENV)/bin/mypy
	PYTHONPATH=operator $(VENV)/bin/lint-imports
	$(PY) -m tpujob.crdgen check

unit: venv binaries
	$(PY) -m pytest -q tests/unit tests/contract

trainer-tests: venv
	$(PY) -m pytest -q tests/trainer

cluster-tests: venv binaries
	$(PY) -m pytest -q tests/e2e

# Two pytest workers, each with a local cluster of its own once it reaches a cluster test: most
# of a cluster test is waiting (for a heartbeat to go stale, a node to be lost, a pod to start),
# so two run in little more time than one. Work is stolen between the workers, so one long drill
# does not leave the other idle. The slowest tests are listed at the end.
# The lint runs beside the tests (its output comes when it ends); either failing fails `test`.
TEST_WORKERS ?= 2
test: venv binaries
	$(MAKE) --no-print-directory -j2 --output-sync=target lint suite

suite: venv binaries
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=25 \
	  tests/unit tests/contract tests/trainer tests/e2e

demo: venv binaries
	$(PY) -m tpujob.demo $(DEMO_ARGS)

bench: venv binaries
	$(PY) bench/bench_diagnosis.py
	$(PY) bench/bench_recovery.py

# tpujob against the JobSet controller and plain Indexed Jobs on kwok's fake TPU pools; the
# default is the quick ladder (minutes). SCALE_ARGS="--scenario ladder drain recovery" runs the
# full sizes (hours on 2 cores). kwok and JobSet are built from tools/kwok and tools/jobset.
SCALE_ARGS ?= --quick
bench-scale: venv binaries
	tools/build-bench-peers.sh
	$(PY) bench/bench_scale.py $(SCALE_ARGS)

bench-goodput: venv binaries
	tools/build-bench-peers.sh
	$(PY) bench/bench_goodput.py $(GOODPUT_ARGS)

# The soak, scenario (d): an hour of 4 real CPU jobs, each created again as it ends, and a fault
# every 2 minutes; the operator's RSS and open fds over time (no JobSet, so no bench peers).
SOAK_ARGS ?=
bench-soak: venv binaries
	$(PY) bench/bench_soak.py $(SOAK_ARGS)

# The operator SIGKILLed at random moments of many soft recoveries (`make test` runs three).
CRASH_DRILL_RECOVERIES ?= 20
crash-drill: venv binaries
	TPUJOB_CRASH_DRILL_RECOVERIES=$(CRASH_DRILL_RECOVERIES) $(PY) -m pytest -q \
	  "tests/e2e/test_recovery_drills.py::test_operator_killed_at_random_moments_of_soft_recoveries_repeats_and_loses_nothing"

e2e-kind:
	hack/e2e-kind.sh

# The operator image and the trainer images (CPU and TPU) as the chart and the examples name
# them, built with Docker from a local Debian base and the locked wheels, with no registry;
# cached per machine by content, so a run with nothing changed builds nothing
# (hack/build-images.sh; `hack/build-images.sh lock` re-resolves the lockfiles).
.PHONY: images
images:
	hack/build-images.sh

# The images pushed to REGISTRY (e.g. us-docker.pkg.dev/PROJECT/REPO) as REGISTRY/NAME:VERSION,
# and the chart's values naming the operator's by its pushed digest in dist/values-release.yaml
# (hack/release.sh; hack/release-check.sh proves it against a registry on the loopback address).
.PHONY: release
release:
	REGISTRY="$(REGISTRY)" hack/release.sh

# The kind node image and kind itself, with no registry: systemd, containerd and runc from
# Debian's packages, Kubernetes and every image the cluster runs from the Go modules pinned under
# tools/ (hack/kind-node-image.sh, docs/kind.md); cached per machine by versions. The image's
# name is the last line printed.
.PHONY: kind-node-image
kind-node-image:
	hack/kind-node-image.sh

clean:
	rm -rf $(VENV) .state

# Re-fit the diagnosis text model on the development corpus and write its committed weights.
diagnosis-model: venv
	$(PY) -m tpujob.diagnosis.training tests/data/corpus/errors.jsonl operator/tpujob/diagnosis/textmodel.json
