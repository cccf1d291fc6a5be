#!/usr/bin/env bash
# A Docker engine for `make images` and `make compose-test`:
#   engine.sh ensure    install what is missing from Debian (docker.io, docker-compose, mmdebstrap)
#                       when root, else say the one command to run; start dockerd if none answers
#   engine.sh release   stop the dockerd that `ensure` started (by its PID), and nothing else
set -euo pipefail
cd "$(dirname "$0")/../.."
PIDFILE=var/dockerd.pid

case "${1:-}" in
ensure)
    need=()
    command -v dockerd >/dev/null || need+=(docker.io)
    { docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null; } || need+=(docker-compose)
    command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
    if [ ${#need[@]} -gt 0 ]; then
        if [ "$EUID" = 0 ] && command -v apt-get >/dev/null; then
            echo "installing from Debian: ${need[*]}"
            export DEBIAN_FRONTEND=noninteractive
            apt-get update -qq
            apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
        else
            echo "the images need: ${need[*]}; run: sudo apt-get install -y --no-install-recommends ${need[*]}" >&2
            exit 1
        fi
    fi
    docker info >/dev/null 2>&1 && exit 0
    [ "$EUID" = 0 ] || { echo "no Docker engine answers; start one (sudo dockerd, or your system's docker service)" >&2; exit 1; }
    mkdir -p var
    echo "starting dockerd (log: var/dockerd.log)"
    dockerd >var/dockerd.log 2>&1 &
    echo $! >"$PIDFILE"
    for _ in $(seq 60); do
        docker info >/dev/null 2>&1 && exit 0
        kill -0 "$(cat "$PIDFILE")" 2>/dev/null || break
        sleep 0.5
    done
    echo "dockerd did not come up; var/dockerd.log ends:" >&2
    tail -20 var/dockerd.log >&2
    exit 1
    ;;
release)
    [ -f "$PIDFILE" ] || exit 0
    pid=$(cat "$PIDFILE")
    rm -f "$PIDFILE"
    kill "$pid" 2>/dev/null || exit 0
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 0.5; done
    echo "dockerd ($pid) did not stop within 20s" >&2
    ;;
*)
    echo "usage: $0 ensure|release" >&2
    exit 2
    ;;
esac
