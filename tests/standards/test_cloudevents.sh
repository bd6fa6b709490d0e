#!/bin/sh
# test_cloudevents.sh - the CloudEvents SDK (Python `cloudevents`, from the virtualenv that
# tests/harness/deps.sh makes) parses every message the relay publishes with --cloudevents
# binary and structured, on every broker; see cloudevents_consumer.py.
set -u
here=$(dirname "$0")
venv=${OUTBOX_PY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/venv}
if ! "$venv/bin/python" -c 'import cloudevents' 2>/dev/null; then
    echo "test_cloudevents: no cloudevents package in $venv: run tests/harness/deps.sh" >&2
    exit 1
fi
exec "$venv/bin/python" "$here/cloudevents_consumer.py" "$@"
