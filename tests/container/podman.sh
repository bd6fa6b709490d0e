# podman.sh - how the container tests run podman on a Debian 12 host: sourced, never run.
#
# runc (crun fails on hosts with hybrid cgroups) with the cgroupfs manager, no default ulimits
# (a sandbox without CAP_SYS_RESOURCE cannot raise them), all through CONTAINERS_CONF, which
# podman-compose's podman calls read too. Builds use chroot isolation.

CONTAINER_TEST_CONF=${CONTAINER_TEST_CONF:-${TMPDIR:-/tmp}/outbox-containers.conf}
if [ ! -f "$CONTAINER_TEST_CONF" ]; then
    printf '[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n' \
        > "$CONTAINER_TEST_CONF.$$"
    mv "$CONTAINER_TEST_CONF.$$" "$CONTAINER_TEST_CONF"
fi
export CONTAINERS_CONF=$CONTAINER_TEST_CONF

# The image under test, and the bases the test builds it from (no registry is reachable): the
# build stage's, minbase with the build packages; the runtime stage's, minbase with the runtime
# libraries, what debian:12-slim plus the Containerfile's apt-get would hold.
TEST_IMAGE=${OUTBOX_TEST_IMAGE:-localhost/outbox-relay:test}
. "$(dirname "${BASH_SOURCE[0]}")/../../deploy/container/debian-bases.sh"
TEST_BUILD_PACKAGES=$DEBIAN_BASE_BUILD_PACKAGES
TEST_RUNTIME_PACKAGES=$DEBIAN_BASE_RUNTIME_PACKAGES
TEST_DEB_CACHE=${OUTBOX_TEST_DEB_CACHE:-/var/cache/outbox-relay-tests/debs}

# podman run with the settings every test container needs here. Without systemd podman cannot
# schedule health checks (the tests run them with `podman healthcheck run`) and says so on
# every run, stop and rm: those lines are dropped.
podman_run() {
    podman run --ulimit host --network host --health-interval disable "$@" \
        2> >(grep -v 'systemd connection' >&2)
}

# Makes localhost/outbox-test/NAME:TAG from Debian 12 packages with mmdebstrap (minbase plus
# the packages, a comma-separated list) unless it exists: the .debs are cached in
# TEST_DEB_CACHE, so a second base downloads only what the first lacked.
debian_image() {
    debian_base "$1" "$2" "$TEST_DEB_CACHE"
}

# The name of a base made of these packages (a comma-separated list): a changed list makes a
# new one.
test_base_image() {
    local name=$1 packages=$2
    echo "localhost/outbox-test/$name:12-$(echo "$packages" | sha256sum | cut -c1-12)"
}
