#!/bin/sh
# rootfs.sh - the runtime image's whole file tree, gathered in the Containerfile's runtime stage.
#
#   rootfs.sh DEST BINARY...
#
# Copies each binary to DEST/usr/local/bin, then every shared library it loads (as ldd lists
# them: libpq, the broker clients and theirs, glibc and the loader) from the Debian packages
# installed in this stage, the CA bundle (amqps://, kafka+ssl://, tls://), nsswitch.conf,
# passwd and group with the unprivileged user outbox (uid and gid 10001), an empty /tmp, and for
# each package a file was taken from, its dpkg status entry (var/lib/dpkg/status.d, where image
# scanners look for package versions) and its copyright file. No shell, no package manager.
set -eu

dest=$1
shift
[ "$#" -gt 0 ] || { echo "usage: rootfs.sh DEST BINARY..." >&2; exit 2; }

packages=$(mktemp)
trap 'rm -f "$packages"' EXIT

# Copies a file (following links) to the same path under DEST, through the real directory, so a
# merged /usr (/lib -> usr/lib) keeps one copy; notes the package it came from.
copy() {
    dir=$(readlink -f "$(dirname "$1")")
    mkdir -p "$dest$dir"
    cp -L "$1" "$dest$dir/$(basename "$1")"
    # dpkg knows a file by the path its package ships: /lib/... or /usr/lib/...
    real=$(readlink -f "$1")
    for path in "$1" "$real" "${real#/usr}"; do
        owner=$(dpkg -S "$path" 2>/dev/null | head -n1 | cut -d: -f1)
        if [ -n "$owner" ]; then
            echo "$owner" >> "$packages"
            return 0
        fi
    done
}

# /lib, /lib64, /bin and /sbin as links into /usr, as in the base.
mkdir -p "$dest/usr/local/bin" "$dest/etc/ssl/certs" "$dest/var/lib/dpkg/status.d" "$dest/tmp"
for link in lib lib64 bin sbin; do
    if [ -L "/$link" ]; then
        ln -sfn "$(readlink "/$link")" "$dest/$link"
    fi
done
chmod 1777 "$dest/tmp"

for binary in "$@"; do
    install -m 755 "$binary" "$dest/usr/local/bin/"
    # "libpq.so.5 => /lib/x86_64-linux-gnu/libpq.so.5 (0x...)" and the loader's "/lib64/ld-... (0x...)"
    ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' |
        while read -r library; do
            [ -e "$library" ] || { echo "rootfs: $binary needs $library, not installed" >&2; exit 1; }
            copy "$library"
        done
done

copy /etc/ssl/certs/ca-certificates.crt
echo ca-certificates >> "$packages" # the bundle is made by its postinst, owned by no package
# OpenSSL's default verify paths (OPENSSLDIR /usr/lib/ssl) lead to the same bundle.
mkdir -p "$dest/usr/lib/ssl"
ln -sfn /etc/ssl/certs/ca-certificates.crt "$dest/usr/lib/ssl/cert.pem"
ln -sfn /etc/ssl/certs "$dest/usr/lib/ssl/certs"
printf 'passwd: files\ngroup: files\nhosts: files dns\nservices: files\n' > "$dest/etc/nsswitch.conf"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\noutbox:x:10001:10001:outbox-relay:/nonexistent:/usr/sbin/nologin\n' \
    > "$dest/etc/passwd"
printf 'root:x:0:\noutbox:x:10001:\n' > "$dest/etc/group"

sort -u "$packages" | while read -r package; do
    name=${package%%:*}
    dpkg-query -s "$package" > "$dest/var/lib/dpkg/status.d/$name"
    if [ -f "/usr/share/doc/$name/copyright" ]; then
        mkdir -p "$dest/usr/share/doc/$name"
        cp "/usr/share/doc/$name/copyright" "$dest/usr/share/doc/$name/"
    fi
done
echo "rootfs: $(sort -u "$packages" | wc -l) packages, $(du -sk "$dest" | cut -f1) KiB"
