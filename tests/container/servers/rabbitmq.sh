#!/bin/sh
# The rabbitmq image's contract: RABBITMQ_DEFAULT_USER and RABBITMQ_DEFAULT_PASS make the user.
set -eu
mkdir -p /etc/rabbitmq /var/lib/rabbitmq /var/log/rabbitmq
cat > /etc/rabbitmq/rabbitmq.conf <<CONF
default_user = ${RABBITMQ_DEFAULT_USER:-guest}
default_pass = ${RABBITMQ_DEFAULT_PASS:-guest}
loopback_users = none
log.console = true
log.file = false
CONF
chown -R rabbitmq:rabbitmq /var/lib/rabbitmq /var/log/rabbitmq
export HOME=/var/lib/rabbitmq
exec setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups -- /usr/lib/rabbitmq/bin/rabbitmq-server
