/*
 * healthcheck.h - `outbox-relay --healthcheck`: one GET /healthz to a relay
 * running with the same --metrics-addr, for a container's health check in an
 * image that has neither a shell nor curl.
 *
 * A wildcard address ("0.0.0.0", "::" or an empty host) is asked on
 * loopback, where the relay listening on all interfaces answers too. The
 * whole exchange, connect included, is bounded by HEALTHCHECK_TIMEOUT_MS.
 */
#ifndef OUTBOX_HEALTHCHECK_H
#define OUTBOX_HEALTHCHECK_H

#include <stddef.h>

#include "error.h"
#include "listen_addr.h"
#include "timeouts.h" /* HEALTHCHECK_TIMEOUT_MS */

/*
 * Asks the /healthz of the relay at addr (not "off"). Returns 0 when it
 * answered 200, 1 when it answered another status (unhealthy), -1 with
 * OUTBOX_ERR_CONNECTION or OUTBOX_ERR_TIMEOUT when nothing answered, or
 * OUTBOX_ERR_INVALID when the answer is not HTTP. On 0 and 1, answer (size
 * bytes) holds the status and the first line of the body: "200 ok",
 * "503 broker down".
 */
int healthcheck_run(const struct listen_addr *addr, char *answer, size_t size,
                    struct outbox_error *err);

#endif
