#!/usr/bin/env bash
# What the tests need from Debian: OpenSSH's server, PostgreSQL, gcc (the fake NVML library),
# Node.js with npm (the Node example consumer), Chromium (the console's browser tests),
# systemd-analyze (enroll's unit is verified with it; nothing here runs systemd), Prometheus (the
# console reads GPU history from a real one), Alertmanager (incidents are posted to a real one) and
# the time zones (the suite runs 14 hours ahead of UTC: tests/conftest.py).
# Installed when missing if we are root with apt-get; otherwise stop at once with the one command
# to run, rather than skip the tests that need them. `make test` runs this first.
set -euo pipefail

need=()
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need+=(postgresql)
command -v gcc >/dev/null || need+=(gcc libc6-dev)
command -v npm >/dev/null || need+=(nodejs npm)
[ -x /usr/bin/chromium ] || need+=(chromium)
command -v systemd-analyze >/dev/null || need+=(systemd)
command -v prometheus >/dev/null || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null || need+=(prometheus-alertmanager)
[ -e /usr/share/zoneinfo/Pacific/Kiritimati ] || need+=(tzdata)
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$EUID" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing from Debian what the tests need: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
else
  echo "the tests need these Debian packages: ${need[*]}" >&2
  echo "run: sudo apt-get install -y --no-install-recommends ${need[*]}" >&2
  exit 1
fi
