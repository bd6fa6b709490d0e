#!/bin/sh
# deps.sh - install the Debian packages outbox-relay needs to build, test and demo.
#
#   deps.sh          install what is missing (as root), or say what to install
#   deps.sh --list   print the package list
set -eu

PACKAGES="build-essential pkg-config libpq-dev librabbitmq-dev libhiredis-dev uuid-dev libcmocka-dev
postgresql-15 rabbitmq-server redis-server redis-sentinel iproute2
systemd prometheus lintian dpkg-dev curl jq
chromium nodejs npm libnats-dev nats-server openssl
librdkafka-dev maven openjdk-17-jre-headless
python3 python3-psycopg2 python3-pika python3-confluent-kafka"

# A Node.js installed another way (NodeSource's nodejs bundles npm and conflicts with
# Debian's npm) serves the browser test as well.
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
    PACKAGES=$(echo $PACKAGES | tr ' ' '\n' | grep -vx 'nodejs\|npm' | tr '\n' ' ')
fi

if [ "${1:-}" = "--list" ]; then
    echo $PACKAGES
    exit 0
fi

missing=""
for package in $PACKAGES; do
    status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
    case "$status" in
    *"install ok installed"*) ;;
    *) missing="$missing $package" ;;
    esac
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" != 0 ]; then
    echo "deps: missing packages:$missing" >&2
    echo "deps: run as root, or: sudo apt-get install -y$missing" >&2
    exit 1
fi

echo "deps: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# Keep the packaged services from starting: tests run their own throwaway servers.
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing
