#!/usr/bin/env bash
# `make test-image`: builds deploy/Dockerfile and runs a books cycle inside the image (ddb_athena_tests/deploy/test_image.py).
# No registry is reachable here, so Docker comes from Debian's packages and the base image from debootstrap (Debian 12,
# the Dockerfile's default base). Without root to provide a Docker daemon, the test is skipped, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE_IMAGE=local/bookworm:base
STATE=.ddb_athena/docker
mkdir -p "$STATE"

started_dockerd=""
stop_dockerd() { if [ -n "$started_dockerd" ]; then kill "$started_dockerd" 2>/dev/null || true; fi; }
trap stop_dockerd EXIT

if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "test-image: skipped: no Docker daemon answers and this user cannot start one (not root)"
    exit 0
  fi
  if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
    apt-get install -y -qq docker.io debootstrap >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq docker.io debootstrap >/dev/null; } \
      || { echo "test-image: skipped: Debian's docker.io and debootstrap could not be installed here"; exit 0; }
  fi
  dockerd --storage-driver=overlay2 >"$STATE/dockerd.log" 2>&1 &
  started_dockerd=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { echo "test-image: skipped: dockerd did not start here (see $STATE/dockerd.log)"; exit 0; }
fi

if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  rootfs=$(mktemp -d)
  debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >"$STATE/debootstrap.log" 2>&1
  # This machine's own certificate authorities (a proxy's, where PyPI is reached through one), as a build host bakes
  # them into its base: the image's ca-certificates package then trusts them.
  mkdir -p "$rootfs/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/" 2>/dev/null || true
  tar -C "$rootfs" -c . | docker import - "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs"
fi

DDB_ATHENA_TEST_BASE_IMAGE="$BASE_IMAGE" .venv/bin/python -m pytest ddb_athena_tests/deploy/test_image.py -m image -p no:cacheprovider "$@"
