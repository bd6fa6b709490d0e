#!/bin/sh
# test_otel.sh - the relay's OpenTelemetry spans, taken by an OTLP receiver built on the
# `opentelemetry-proto` package (PyPI, in the virtualenv tests/harness/deps.sh makes):
# parents, conventions, sampling, and a collector down, slow and restarted; see otel_spans.py.
set -u
here=$(dirname "$0")
venv=${OUTBOX_PY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/venv}
if ! "$venv/bin/python" -c 'import opentelemetry.proto' 2>/dev/null; then
    echo "test_otel: no opentelemetry-proto package in $venv: run tests/harness/deps.sh" >&2
    exit 1
fi
exec "$venv/bin/python" "$here/otel_spans.py" "$@"
