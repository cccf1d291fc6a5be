#!/usr/bin/env bash
# Build gpumedic's images with no image registry (`make images`):
#   1. gpumedic-base:bookworm, a Debian bookworm root file system with python3, from Debian's
#      packages (mmdebstrap), unless the engine already has it;
#   2. build/images/: a wheel of every package at uv.lock's exact version, and those versions as
#      constraints, so no image build downloads anything from PyPI;
#   3. every image compose.yaml builds (docker compose, or Debian's docker-compose v1).
# UV and PIP name this machine's uv and pip (the Makefile passes its own).
set -euo pipefail
cd "$(dirname "$0")/../.."
UV=${UV:-uv}
PIP=${PIP:-pip}
BASE=gpumedic-base:bookworm
OUT=build/images

docker info >/dev/null 2>&1 || { echo "no Docker engine answers (start dockerd, or see README: compose)" >&2; exit 1; }
if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    command -v mmdebstrap >/dev/null || { echo "building $BASE needs mmdebstrap: apt-get install mmdebstrap" >&2; exit 1; }
    echo "building $BASE from Debian's packages (mmdebstrap, about half a minute)"
    mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates bookworm - | docker import - "$BASE" >/dev/null
fi

rm -rf "$OUT" && mkdir -p "$OUT/wheels"
"$UV" export --quiet --frozen --no-dev --all-packages --no-hashes --no-emit-workspace --format requirements.txt -o "$OUT/constraints.txt"
"$PIP" download --quiet --disable-pip-version-check --only-binary :all: --no-deps -r "$OUT/constraints.txt" -d "$OUT/wheels"
"$UV" build --quiet --all-packages --wheel -o "$OUT/wheels"
echo "wheels: $(ls "$OUT/wheels" | wc -l) in $OUT/wheels"

compose=(docker compose)
docker compose version >/dev/null 2>&1 || compose=(docker-compose)
# every image, the GPU node's node-sampler and the demo fleet's included; then the build stages go
"${compose[@]}" --env-file deploy/env.example -f compose.yaml -f deploy/compose.demo.yaml --profile node --profile monitoring build
docker image prune --force --filter label=gpumedic.stage=build >/dev/null
