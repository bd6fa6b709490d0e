#!/bin/sh
# The nats image's contract: the command is nats-server's arguments.
exec nats-server "$@"
