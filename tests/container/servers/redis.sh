#!/bin/sh
# The redis image's contract: the command is redis-server and its arguments, run in /data; like
# the official build, protected mode is off (the compose network is the boundary).
set -eu
mkdir -p /data
cd /data
if [ "${1:-}" = redis-server ]; then
    shift
    set -- redis-server --protected-mode no "$@"
fi
exec "$@"
