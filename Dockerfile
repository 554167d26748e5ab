# syntax=docker/dockerfile:1
#
# gpuwarden: one image for both processes. The DaemonSet runs
# `gpuwarden agent`, the Deployment runs `gpuwarden scheduler`; only the
# arguments differ, so one image is built, scanned and pulled.
#
#   docker build -t gpuwarden:dev .      (or: make image)

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: turn the source tree into a wheel --------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the wheel is made of (see .dockerignore), so editing tests or
# manifests does not invalidate this layer.
COPY pyproject.toml README.md ./
COPY gpuwarden ./gpuwarden
COPY agent ./agent
COPY scheduler ./scheduler
RUN python -m pip wheel --no-deps --wheel-dir /wheels .

# ---- runtime: the wheel and its pinned dependencies, nothing else ------------
FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# constraints.txt pins every dependency to the versions the tests ran with.
COPY --from=build /wheels /tmp/wheels
COPY constraints.txt /tmp/constraints.txt
RUN python -m pip install -c /tmp/constraints.txt /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels /tmp/constraints.txt

# Non-root by default: the scheduler needs nothing but its ServiceAccount
# token. Only the agent's container raises privileges, in its DaemonSet
# manifest (manifests/daemonset.yaml), because hardware access needs them:
# /dev/kmsg, the NVIDIA device nodes and host sysfs. NVML's library,
# libnvidia-ml.so, is mounted into the container by the NVIDIA container
# runtime, not shipped here.
USER 65532:65532

ENTRYPOINT ["gpuwarden"]
CMD ["--help"]
