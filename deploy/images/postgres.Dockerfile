# PostgreSQL for compose, from Debian's own package (no image registry is needed). Takes
# POSTGRES_USER, POSTGRES_PASSWORD and POSTGRES_DB on first start, as the usual postgres image does.
ARG BASE_IMAGE=gpumedic-base:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql-15 >/dev/null \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data && chown postgres:postgres /var/lib/postgresql/data && chmod 700 /var/lib/postgresql/data
COPY deploy/images/postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
USER postgres
EXPOSE 5432
ENTRYPOINT ["postgres-entrypoint"]
