# Prometheus and Alertmanager for compose's `monitoring` profile, from Debian's own packages (no
# image registry is needed), on the same Debian base as the services. compose runs either binary.
ARG BASE_IMAGE=gpumedic-base:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager >/dev/null \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -m 1777 /prometheus /alertmanager \
    && mkdir -p /srv/deploy /srv/var
# /srv/deploy holds the configuration compose mounts; deploy/prometheus.yml's file_sd paths for the
# embedded stack (../var/...) resolve to the empty /srv/var here.
EXPOSE 9090 9093
