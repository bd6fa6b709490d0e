/*
 * probe.h - whether database servers answer at all, many at once.
 *
 * A server that accepts connections and never answers holds a libpq
 * connect for its whole connect_timeout; a list naming hundreds of them
 * would hold the relay's slots for a connect_timeout each before it first
 * reached a healthy database. probe_servers() asks every server of a set
 * of URLs at once, without libpq: a TCP (or Unix socket) connect and a
 * PostgreSQL SSLRequest, which every server and pooler answers with one
 * byte before any authentication. A server that answers 'N' logs nothing
 * when the client then closes; one with ssl = on answers 'S' and logs that
 * the client went away.
 */
#ifndef OUTBOX_RELAY_PROBE_H
#define OUTBOX_RELAY_PROBE_H

#include <stdbool.h>
#include <stddef.h>

/* What a probe learned of one URL's server. */
enum probe_answer {
    PROBE_ANSWERED,   /* the server answered the SSLRequest */
    PROBE_SILENT,     /* no answer within the time (or the connection was refused or reset) */
    PROBE_UNKNOWN,    /* not probed: several hosts, a host name that does not resolve now, ... */
};

/*
 * Probes the server of each of count URLs (libpq URLs or key=value
 * strings), all at once, for timeout_ms at most; answers[i] gets what was
 * learned of urls[i]'s server. URLs naming one server are probed once.
 * Host names are resolved first (getaddrinfo, which may block).
 */
void probe_servers(const char *const *urls, size_t count, int timeout_ms,
                   enum probe_answer *answers);

#endif
