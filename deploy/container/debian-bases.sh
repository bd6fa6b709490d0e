# debian-bases.sh - the image's two bases made from Debian 12 packages, for building without a
# container registry: sourced (by deploy/container/image-offline.sh and the container tests),
# never run.
#
# The build stage's base is minbase with the build packages; the runtime stage's is minbase with
# the runtime libraries, what debian:12-slim plus the Containerfile's apt-get would hold. Both
# are made by mmdebstrap from a Debian mirror (DEBIAN_MIRROR, e.g. an internal one; default
# mmdebstrap's own choice) and imported into podman.
DEBIAN_BASE_BUILD_PACKAGES="build-essential,pkg-config,libpq-dev,librabbitmq-dev,libhiredis-dev,uuid-dev,libnats-dev,librdkafka-dev,ca-certificates"
DEBIAN_BASE_RUNTIME_PACKAGES="libpq5,librabbitmq4,libhiredis0.14,libnats3.4,librdkafka1,libuuid1,ca-certificates"

# Makes podman image IMAGE from Debian 12 packages with mmdebstrap (minbase plus PACKAGES, a
# comma-separated list) unless it exists. The .debs are cached in DEB_CACHE, so a second base
# downloads only what the first lacked.
debian_base() {
    local image=$1 packages=$2 deb_cache=$3 tar
    podman image exists "$image" && return 0
    tar=$(mktemp "${TMPDIR:-/tmp}/outbox-base.XXXXXX.tar")
    mkdir -p "$deb_cache"
    echo "podman: making $image from Debian 12 packages (mmdebstrap, once)"
    # shellcheck disable=SC2086 # DEBIAN_MIRROR: none, or one mirror
    mmdebstrap --quiet --variant=minbase --include="$packages" \
        --skip=download/empty --skip=essential/unlink \
        --setup-hook='mkdir -p "$1"/var/cache/apt/archives/' \
        --setup-hook="sync-in $deb_cache /var/cache/apt/archives/" \
        --customize-hook="sync-out /var/cache/apt/archives $deb_cache" \
        bookworm "$tar" ${DEBIAN_MIRROR:-} || { rm -f "$tar"; return 1; }
    podman import --quiet "$tar" "$image" >/dev/null || { rm -f "$tar"; return 1; }
    rm -f "$tar"
}
