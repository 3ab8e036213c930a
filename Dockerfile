# The tpujob operator image: ghcr.io/tpujob/tpujob-operator.
# `make images` builds it (hack/build-images.sh: a local Debian base, wheels from the lockfile,
# no network during the build). By hand, from the repository root, on the public base:
#   docker build -t ghcr.io/tpujob/tpujob-operator:0.1.0 .
# It runs as uid 65532 with a read-only root filesystem; the chart mounts /tmp as an emptyDir,
# the only place anything is written.

# Any image with Python 3.11 as python3. The default is the public python:3.11.14-slim-bookworm,
# pinned by the digest of its multi-architecture index, so that a rebuild anywhere starts from
# the same files (renew it with `docker buildx imagetools inspect python:3.11-slim-bookworm`,
# the "Digest:" line). `make images` builds on Debian bookworm's own python3 instead (a base
# made with debootstrap from a fixed recipe), or on BASE_IMAGE when it is set.
ARG BASE_IMAGE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# The lockfiles pin every package by version and hash. `make images` also puts each locked wheel
# under .wheels/ in the context, and then pip installs from there alone; without .wheels/ the
# same hashed files come from PyPI.
COPY requirements/build.lock requirements/operator.lock .wheel[s] /wheels/
# Two virtual environments, which works on both bases (Debian's python3 is "externally
# managed"): /opt/build holds the build tools, /opt/venv only what the operator runs.
RUN set -eu; \
    if ls /wheels/*.whl >/dev/null 2>&1; then export PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels; fi; \
    python3 -m venv /opt/build; \
    /opt/build/bin/pip install --quiet --require-hashes --only-binary :all: -r /wheels/build.lock; \
    python3 -m venv --without-pip /opt/venv; \
    /opt/build/bin/pip --python /opt/venv/bin/python install --quiet --require-hashes \
      --only-binary :all: -r /wheels/operator.lock
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
# The operator itself, without dependencies (all locked above), and without what only a
# developer's machine runs: `tpujob local` (a cluster of local processes, with fault injection)
# and the demo built on it; `tpujob local` then says it is not in this build. Bytecode is
# compiled here: the running container cannot write it, and would otherwise recompile in memory
# on every start.
RUN rm -r operator/tpujob/local operator/tpujob/demo.py \
    && /opt/build/bin/pip wheel --quiet --no-deps --no-build-isolation --wheel-dir /dist . \
    && /opt/build/bin/pip --python /opt/venv/bin/python install --quiet --no-deps --no-index \
      /dist/*.whl \
    && /opt/venv/bin/python -m compileall -q --invalidation-mode unchecked-hash /opt/venv/lib

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="tpujob-operator" \
      org.opencontainers.image.description="Runs TPU training jobs on Kubernetes and keeps them training through failures" \
      org.opencontainers.image.source="https://github.com/tpujob/tpujob" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/venv /opt/venv
# A name for uid 65532: kopf names the replica after the user when POD_ID is not set (outside
# the chart), and getpass fails for a uid without one.
RUN useradd --uid 65532 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin \
      tpujob
# No .pyc writes (the root filesystem is read-only), unbuffered logs, and a writable HOME
# for libraries that cache under it.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
WORKDIR /tmp
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["tpujob"]
CMD ["operator", "--all-namespaces", "--metrics-port", "9090", "--liveness-port", "8080"]
