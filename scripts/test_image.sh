#!/usr/bin/env bash
# `make test-image`: builds deploy/Dockerfile and runs a books cycle inside the image (ddb_athena_tests/deploy/test_image.py).
# No registry is reachable here, so Docker comes from Debian's packages and the base image from debootstrap (Debian 12,
# the Dockerfile's default base). Without root to provide a Docker daemon, the test is skipped, saying so.
#
# ARCH=arm64 (`make test-image-arm64`) builds and tests the Graviton image on an x86 machine: its binaries run through
# QEMU (Debian's qemu-user-static, registered with the kernel's binfmt_misc), several times slower than natively.
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=${ARCH:-amd64}
BASE_IMAGE=local/bookworm:base-$ARCH
STATE=.ddb_athena/docker
mkdir -p "$STATE"

started_dockerd=""
stop_dockerd() { if [ -n "$started_dockerd" ]; then kill "$started_dockerd" 2>/dev/null || true; fi; }
trap stop_dockerd EXIT
skip() { echo "test-image: skipped: $1"; exit 0; }
install_debian_packages() { apt-get install -y -qq "$@" >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq "$@" >/dev/null; }; }

if ! docker info >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || skip "no Docker daemon answers and this user cannot start one (not root)"
  if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
    install_debian_packages docker.io debootstrap || skip "Debian's docker.io and debootstrap could not be installed here"
  fi
  dockerd --storage-driver=overlay2 >"$STATE/dockerd.log" 2>&1 &
  started_dockerd=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || skip "dockerd did not start here (see $STATE/dockerd.log)"
fi

if [ "$ARCH" != "$(dpkg --print-architecture)" ]; then
  # The F flag (Debian's registration sets it) makes the kernel hold the emulator, so it runs inside containers too.
  [ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc \
    || skip "the kernel's binfmt_misc cannot be mounted here, so $ARCH binaries cannot run"
  qemu=/proc/sys/fs/binfmt_misc/qemu-$(case $ARCH in arm64) echo aarch64 ;; *) echo "$ARCH" ;; esac)
  [ -e "$qemu" ] || install_debian_packages qemu-user-static binfmt-support || skip "Debian's qemu-user-static could not be installed here"
  grep -q '^flags: .*F' "$qemu" || skip "$qemu is registered without the F flag: containers cannot reach the emulator"
fi

if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  rootfs=$(mktemp -d)
  debootstrap --variant=minbase --arch="$ARCH" bookworm "$rootfs" http://deb.debian.org/debian >"$STATE/debootstrap-$ARCH.log" 2>&1
  # This machine's own certificate authorities (a proxy's, where PyPI is reached through one), as a build host bakes
  # them into its base: the image's ca-certificates package then trusts them.
  mkdir -p "$rootfs/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/" 2>/dev/null || true
  tar -C "$rootfs" -c . | docker import --platform "linux/$ARCH" - "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs"
fi

DDB_ATHENA_TEST_BASE_IMAGE="$BASE_IMAGE" DDB_ATHENA_TEST_IMAGE_PLATFORM="linux/$ARCH" \
  .venv/bin/python -m pytest ddb_athena_tests/deploy/test_image.py -m image -p no:cacheprovider "$@"
