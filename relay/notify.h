/*
 * notify.h - readiness and watchdog notifications to a service manager.
 *
 * The sd_notify(3) datagram protocol without libsystemd: when the process
 * runs under systemd with Type=notify, $NOTIFY_SOCKET names a datagram
 * socket (a path, or '@' for the abstract namespace) to which it sends
 * "READY=1", "STOPPING=1" or "WATCHDOG=1". Without $NOTIFY_SOCKET every call
 * does nothing and succeeds, so the relay runs the same by hand. Nothing
 * here prints or exits.
 */
#ifndef OUTBOX_NOTIFY_H
#define OUTBOX_NOTIFY_H

#include <stdint.h>

#include "outbox.h"

/*
 * Sends state (e.g. "READY=1") to $NOTIFY_SOCKET. Returns 0 when sent or
 * when there is no service manager to tell; -1 with OUTBOX_ERR_CONFIG when
 * $NOTIFY_SOCKET is not a socket path, OUTBOX_ERR_CONNECTION when sending
 * failed.
 */
int notify_send(const char *state, struct outbox_error *err);

/*
 * The watchdog interval in microseconds the service manager asked for
 * ($WATCHDOG_USEC, honoured only when $WATCHDOG_PID is unset or this
 * process), or 0 when there is no watchdog. Send "WATCHDOG=1" at least
 * twice per interval.
 */
uint64_t notify_watchdog_usec(void);

#endif
