# syntax=docker/dockerfile:1
# One image for the whole product: `prefixfleet` is the entrypoint and the subcommand picks the role.
#   operator:  (default) prefixfleet operator run
#   gateway:   prefixfleet router gateway ...
#   sidecar:   prefixfleet router sidecar ...
#   emulator:  prefixfleet emulator ...
# The operator starts gateways, sidecars and emulators with this same image and explicit args.

ARG PYTHON_IMAGE=python:3.11-slim

# ---- builder: a wheel of prefixfleet plus wheels of every dependency (compilers stay here)
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m pip install "setuptools>=77,<81"
# Only what the wheel is built from (see .dockerignore); one folder per package-dir of pyproject.toml.
COPY pyproject.toml README.md ./
COPY prefixfleet ./prefixfleet
COPY router ./router
COPY operator ./operator
COPY sim ./sim
COPY emulator ./emulator
RUN python -m pip wheel --no-build-isolation --wheel-dir /wheels .

# ---- runtime: the slim base, the wheels installed offline, a non-root user
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="prefixfleet" \
      org.opencontainers.image.description="Prefix-cache-aware routing, autoscaling and operator for LLM fleets" \
      org.opencontainers.image.source="https://github.com/prefixfleet/prefixfleet" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --system --gid 10001 prefixfleet \
 && useradd --system --uid 10001 --gid 10001 --home-dir /home/prefixfleet --create-home \
      --shell /usr/sbin/nologin prefixfleet
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m pip install --no-index --find-links=/wheels prefixfleet
# Numeric uid so `runAsNonRoot` can verify it without resolving names.
USER 10001:10001
WORKDIR /home/prefixfleet
# gateway 8080, sidecar 8100, emulator 30000; operator pod: kopf liveness 8080, metrics 8081
EXPOSE 8080 8081 8100 30000
# No HEALTHCHECK: each role listens on its own port and Kubernetes probes them per container.
ENTRYPOINT ["prefixfleet"]
CMD ["operator", "run"]
