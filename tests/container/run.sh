#!/bin/bash
# run.sh - `make test-image`: the container image, the compose file and the Helm chart.
#
# As root, installs what is missing of podman, runc, podman-compose, mmdebstrap and their
# helpers (Debian 12 packages). Makes the Debian 12 base of the image's build stages with
# mmdebstrap once (no registry is reachable; later runs reuse it), builds the image with
# `make image` while a throwaway PostgreSQL, Redis and RabbitMQ start (tests/harness/stack.sh),
# then runs test_image.sh, test_compose.sh and test_helm.sh, each even when another failed.
set -eu

SOURCE_DIR=$(cd "$(dirname "$0")/../.." && pwd)
cd "$SOURCE_DIR"
PACKAGES="podman runc podman-compose mmdebstrap uidmap slirp4netns fuse-overlayfs
golang-github-containernetworking-plugin-dnsname"

missing=""
for package in $PACKAGES; do
    dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null | grep -qx installed ||
        missing="$missing $package"
done
if [ -n "$missing" ]; then
    [ "$(id -u)" = 0 ] || { echo "test-image: missing packages:$missing (install them as root)" >&2; exit 1; }
    echo "test-image: installing$missing"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing
fi
[ "$(id -u)" = 0 ] || { echo "test-image: podman here needs root (runc, cgroupfs)" >&2; exit 1; }

. tests/container/podman.sh
started=$(date +%s)
STACK_DIR=$(mktemp -d "${TMPDIR:-/tmp}/outbox-image-stack.XXXXXX")
stack_pid=""
stop_stack() {
    [ -z "$stack_pid" ] || wait "$stack_pid" 2>/dev/null || true
    tests/harness/stack.sh stop "$STACK_DIR" >/dev/null 2>&1 || true
    rm -rf "$STACK_DIR"
}
trap stop_stack EXIT

# The servers start while the image builds.
tests/harness/stack.sh start "$STACK_DIR" postgres redis rabbitmq > "$STACK_DIR.log" 2>&1 &
stack_pid=$!

build_base=$(test_base_image debian-build "$TEST_BUILD_PACKAGES")
runtime_base=$(test_base_image debian-slim "$TEST_RUNTIME_PACKAGES")
debian_image "$build_base" "$TEST_BUILD_PACKAGES"
debian_image "$runtime_base" "$TEST_RUNTIME_PACKAGES"
build_started=$(date +%s)
make --no-print-directory image IMAGE="$TEST_IMAGE" CONTAINER_ENGINE=podman \
    IMAGE_BUILD_ARGS="--quiet --isolation chroot --build-arg BUILD_IMAGE=$build_base --build-arg BASE_IMAGE=$runtime_base" \
    >/dev/null
echo "test-image: image $TEST_IMAGE built in $(($(date +%s) - build_started)) s"

if ! wait "$stack_pid"; then
    stack_pid=""
    sed 's/^/test-image:   | /' "$STACK_DIR.log" >&2
    echo "test-image: the stack did not start" >&2
    exit 1
fi
stack_pid=""
rm -f "$STACK_DIR.log"
set -a
. "$STACK_DIR/env"
set +a
export OUTBOX_SOURCE_DIR=$SOURCE_DIR OUTBOX_TEST_IMAGE=$TEST_IMAGE

status=0
failed=""
for test in tests/container/test_image.sh tests/container/test_compose.sh tests/container/test_helm.sh; do
    echo "== $test"
    if ! bash "$test"; then
        status=1
        failed="$failed $(basename "$test")"
    fi
done
echo "test-image: $(($(date +%s) - started)) s;${failed:- all passed}${failed:+ failed:$failed}"
exit "$status"
