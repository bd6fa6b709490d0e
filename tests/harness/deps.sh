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
python3 python3-psycopg2 python3-pika python3-confluent-kafka python3-venv"

# A Node.js installed another way (NodeSource's nodejs bundles npm and conflicts with
# Debian's npm) serves the browser test as well.
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
    PACKAGES=$(echo $PACKAGES | tr ' ' '\n' | grep -vx 'nodejs\|npm' | tr '\n' ' ')
fi

# PyPI packages the standards tests read the relay's output with (tests/standards): the
# CloudEvents SDK and the OpenTelemetry protocol's messages, in a virtualenv outside the
# source tree that also sees Debian's python3 packages (psycopg2, pika, confluent-kafka).
PY_PACKAGES="cloudevents==2.2.0 opentelemetry-proto==1.45.2"
PY_VENV=${OUTBOX_PY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/venv}

if [ "${1:-}" = "--list" ]; then
    echo $PACKAGES
    exit 0
fi

# Makes the virtualenv when a package of PY_PACKAGES is missing from it.
python_packages() {
    if "$PY_VENV/bin/python" -c 'import cloudevents, opentelemetry.proto' 2>/dev/null; then
        return 0
    fi
    echo "deps: installing $PY_PACKAGES into $PY_VENV"
    /usr/bin/python3 -m venv --system-site-packages "$PY_VENV" &&
        "$PY_VENV/bin/pip" install -q --disable-pip-version-check $PY_PACKAGES
}

missing=""
for package in $PACKAGES; do
    status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
    case "$status" in
    *"install ok installed"*) ;;
    *) missing="$missing $package" ;;
    esac
done
if [ -z "$missing" ]; then
    python_packages
    exit $?
fi

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
python_packages
