#!/bin/bash
# run.sh - `make test-image`: the container image, the compose file and the Helm chart.
#
# As root, installs what is missing of podman, runc, podman-compose, mmdebstrap and their
# helpers (Debian 12 packages). Builds the image with `make image-offline` (no registry is
# reachable: the Debian 12 bases of its stages are made with mmdebstrap once, later runs reuse
# them) while a throwaway PostgreSQL, Redis and RabbitMQ start (tests/harness/stack.sh),
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

# the README's route without a registry: `make image-offline`, bases from Debian packages
build_started=$(date +%s)
OUTBOX_DEB_CACHE=$TEST_DEB_CACHE make --no-print-directory image-offline IMAGE="$TEST_IMAGE" \
    IMAGE_OFFLINE_ARGS="--quiet --isolation chroot" >/dev/null
echo "test-image: image $TEST_IMAGE built (make image-offline) in $(($(date +%s) - build_started)) s"

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
