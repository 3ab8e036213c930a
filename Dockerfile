# The tpujob operator image: ghcr.io/tpujob/tpujob-operator.
# Build from the repository root:  docker build -t ghcr.io/tpujob/tpujob-operator:0.1.0 .
# It runs as uid 65532 with a read-only root filesystem; the chart mounts /tmp as an emptyDir,
# the only place anything is written.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
# A separate prefix lets the runtime stage copy exactly what was installed, without pip's
# build dependencies or the sources.
RUN pip install --prefix=/install ".[gcp]"

FROM python:3.11-slim
LABEL org.opencontainers.image.title="tpujob-operator" \
      org.opencontainers.image.description="Runs TPU training jobs on Kubernetes and keeps them training through failures" \
      org.opencontainers.image.source="https://github.com/tpujob/tpujob" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /install /usr/local
# No .pyc writes (the root filesystem is read-only), unbuffered logs, and a writable HOME
# for libraries that cache under it.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# Compile bytecode here against the final file paths and times: the running container cannot
# write it, and would otherwise recompile in memory on every start.
RUN python -m compileall -q /usr/local/lib/python3.11/site-packages
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["tpujob"]
CMD ["operator", "--all-namespaces", "--metrics-port", "9090", "--liveness-port", "8080"]
