#!/bin/sh
# build-deb.sh - the Debian packages, with dpkg-deb, from a staged `make install`.
#
#   VERSION=0.2.0 BUILD=build BIN=bin LIB=lib DEB_OUT=build/deb deploy/debian/build-deb.sh
#
# Makes two packages in DEB_OUT:
#   outbox-relay_VERSION_ARCH.deb    the daemon, outboxctl, the SQL, man pages, the
#                                    systemd unit and the example configuration
#   liboutbox-dev_VERSION_ARCH.deb   liboutbox.a, outbox.h and outbox.pc
# Run by `make deb`; needs dpkg-dev (dpkg-shlibdeps) and binutils.
set -eu

SOURCE_DIR=$(cd "$(dirname "$0")/../.." && pwd)
cd "$SOURCE_DIR"
: "${VERSION:?}" "${BUILD:=build}" "${BIN:=bin}" "${LIB:=lib}" "${DEB_OUT:=$BUILD/deb}"
ARCH=$(dpkg --print-architecture)
MULTIARCH=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
MAINTAINER="outbox-relay maintainers <outbox-relay@example.org>"
STAGE=$BUILD/deb-stage
case "$DEB_OUT" in /*) ;; *) DEB_OUT=$SOURCE_DIR/$DEB_OUT ;; esac

rm -rf "$STAGE"
mkdir -p "$STAGE" "$DEB_OUT"
make --no-print-directory install BUILD="$BUILD" BIN="$BIN" LIB="$LIB" \
    DESTDIR="$SOURCE_DIR/$STAGE/all" PREFIX=/usr LIBDIR="/usr/lib/$MULTIARCH" \
    UNITDIR=/lib/systemd/system >/dev/null

# Moves path (relative to the staged install) into package dir.
take() {
    mkdir -p "$(dirname "$2/$1")"
    mv "$STAGE/all/$1" "$2/$1"
}

# The files every Debian package carries in /usr/share/doc/NAME.
add_docs() {
    local name=$1 root=$2 doc
    doc=$root/usr/share/doc/$name
    mkdir -p "$doc"
    sed "s/@NAME@/$name/" deploy/debian/copyright > "$doc/copyright"
    {
        printf '%s (%s) unstable; urgency=medium\n\n' "$name" "$VERSION"
        printf '  * Release %s.\n\n' "$VERSION"
        printf ' -- %s  %s\n' "$MAINTAINER" "$(date -R -u -d @"${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}")"
    } | gzip -9n > "$doc/changelog.gz"
}

# Writes DEBIAN/control and md5sums for root and builds the .deb.
build_package() {
    local name=$1 root=$2 depends=$3 section=$4 summary=$5 description=$6
    mkdir -p "$root/DEBIAN"
    {
        printf 'Package: %s\nVersion: %s\nArchitecture: %s\n' "$name" "$VERSION" "$ARCH"
        printf 'Maintainer: %s\n' "$MAINTAINER"
        printf 'Installed-Size: %s\n' "$(du -sk --exclude=DEBIAN "$root" | cut -f1)"
        printf 'Depends: %s\nSection: %s\nPriority: optional\n' "$depends" "$section"
        printf 'Description: %s\n%s\n' "$summary" "$description"
    } > "$root/DEBIAN/control"
    (cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z |
        xargs -0 md5sum > DEBIAN/md5sums)
    find "$root" -type d -exec chmod 755 {} +
    chmod 644 "$root/DEBIAN/control" "$root/DEBIAN/md5sums"
    dpkg-deb --root-owner-group -Zxz --build "$root" "$DEB_OUT/${name}_${VERSION}_${ARCH}.deb" >/dev/null
    echo "deb: $DEB_OUT/${name}_${VERSION}_${ARCH}.deb"
}

# --- outbox-relay: programs, SQL, man pages, unit, examples ---
RELAY=$STAGE/outbox-relay
take usr/bin "$RELAY"
take usr/share/outbox-relay "$RELAY"
take usr/share/man "$RELAY"
take lib/systemd "$RELAY"
take usr/share/doc/outbox-relay "$RELAY"
strip --remove-section=.comment --remove-section=.note --strip-unneeded \
    "$RELAY/usr/bin/outbox-relay" "$RELAY/usr/bin/outboxctl"
gzip -9n "$RELAY"/usr/share/man/man*/*
add_docs outbox-relay "$RELAY"
mkdir -p "$STAGE/shlibs/debian"
printf 'Source: outbox-relay\n\nPackage: outbox-relay\nArchitecture: any\n' > "$STAGE/shlibs/debian/control"
RELAY_ABS=$SOURCE_DIR/$RELAY
relay_depends=$(cd "$STAGE/shlibs" && dpkg-shlibdeps -O "$RELAY_ABS/usr/bin/outbox-relay" \
    "$RELAY_ABS/usr/bin/outboxctl" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
build_package outbox-relay "$RELAY" "$relay_depends" net \
    "transactional outbox relay from PostgreSQL to RabbitMQ or Redis Streams" \
" Applications commit their business data and a row in the outbox.job table
 in one PostgreSQL transaction. outbox-relay claims ready rows with leases,
 publishes them to RabbitMQ or Redis Streams with the job id as message id,
 and marks them succeeded while its lease still holds; any number of relays
 can run at once. outboxctl migrates the schema and inspects the queue.
 .
 A systemd template unit runs one relay per /etc/outbox-relay/NAME.env."

# --- liboutbox-dev: the C library for producers and in-database workers ---
DEV=$STAGE/liboutbox-dev
take "usr/lib/$MULTIARCH" "$DEV"
take usr/include "$DEV"
strip --strip-debug --enable-deterministic-archives "$DEV/usr/lib/$MULTIARCH/liboutbox.a"
add_docs liboutbox-dev "$DEV"
build_package liboutbox-dev "$DEV" "libpq-dev, librabbitmq-dev, libhiredis-dev, uuid-dev, librdkafka-dev" libdevel \
    "transactional outbox C library (static) and header" \
" liboutbox enqueues rows into outbox.job inside the caller's PostgreSQL
 transaction, and claims, extends, completes and fails them for workers,
 fenced by lease and generation. Build with pkg-config --cflags --libs outbox."

leftover=$(cd "$STAGE/all" && find . -type f | head -n 5)
if [ -n "$leftover" ]; then
    echo "deb: installed files in no package: $leftover" >&2
    exit 1
fi
