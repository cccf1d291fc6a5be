# One image per gpumedic package, each with only what that package needs (node-sampler gets no
# SQLAlchemy and no asyncssh). Built by `make images` (deploy/images/build.sh) on a Debian base
# made from Debian's packages, from wheels of uv.lock's exact versions: nothing is downloaded here.
# compose names each container's command (gpumedic-zombie-detector, gpumedic-provision, ...).
ARG BASE_IMAGE=gpumedic-base:bookworm
FROM ${BASE_IMAGE} AS build
LABEL gpumedic.stage=build
ARG PACKAGE
RUN test -n "$PACKAGE" || (echo "build with --build-arg PACKAGE=gpumedic-<service>" && false)
COPY build/images /build
RUN python3 -m venv /app/.venv \
    && /app/.venv/bin/pip install --quiet --no-index --no-cache-dir --disable-pip-version-check \
        --find-links /build/wheels --constraint /build/constraints.txt "$PACKAGE"

FROM ${BASE_IMAGE}
COPY --from=build /app/.venv /app/.venv
# /var/lib/gpumedic: for a volume two containers share (the demo fleet's files); a new volume takes its mode
RUN useradd --system --uid 10001 --user-group --no-create-home gpumedic && mkdir -m 1777 /var/lib/gpumedic
ENV PATH=/app/.venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1
USER 10001
