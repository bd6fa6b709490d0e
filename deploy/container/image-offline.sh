#!/bin/bash
# image-offline.sh - `make image-offline`: the container image where no container registry can
# be reached (air-gapped), from bases made of Debian 12 packages (deploy/container/debian-bases.sh)
# instead of debian:12 and debian:12-slim. Needs podman and mmdebstrap, and a Debian mirror
# (DEBIAN_MIRROR=http://mirror.internal/debian, else mmdebstrap's default); the bases are made
# once and kept as localhost/outbox-relay-base/{build,runtime}:12-<hash of the package list>.
#
#   image-offline.sh [EXTRA BUILD ARGUMENTS]     (IMAGE, VERSION... as for make image)
set -eu

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
. deploy/container/debian-bases.sh
DEB_CACHE=${OUTBOX_DEB_CACHE:-/var/cache/outbox-relay/debs}

for tool in podman mmdebstrap; do
    command -v "$tool" >/dev/null ||
        { echo "image-offline: $tool is missing (apt-get install podman mmdebstrap)" >&2; exit 2; }
done
base_name() {
    echo "localhost/outbox-relay-base/$1:12-$(echo "$2" | sha256sum | cut -c1-12)"
}
build_base=$(base_name build "$DEBIAN_BASE_BUILD_PACKAGES")
runtime_base=$(base_name runtime "$DEBIAN_BASE_RUNTIME_PACKAGES")
debian_base "$build_base" "$DEBIAN_BASE_BUILD_PACKAGES" "$DEB_CACHE"
debian_base "$runtime_base" "$DEBIAN_BASE_RUNTIME_PACKAGES" "$DEB_CACHE"
exec make --no-print-directory image CONTAINER_ENGINE=podman \
    IMAGE_BUILD_ARGS="$* --build-arg BUILD_IMAGE=$build_base --build-arg BASE_IMAGE=$runtime_base"
