/*
 * proxy.h - a loopback TCP proxy that the chaos driver puts between the
 * relays and a server (PostgreSQL or a broker) to break the network on
 * purpose.
 *
 * The proxy listens on 127.0.0.1 (an ephemeral port, or the one asked for)
 * and forwards every accepted connection to 127.0.0.1:target_port, one
 * thread per connection pair. At any moment it can cut every open
 * connection (both ends see a reset or EOF, new connections still work),
 * stall them (bytes stay queued, nobody reads, until the stall ends), or
 * slow them (each chunk waits a delay before it is forwarded), or slow
 * each new connection's start alone. Every socket
 * is close-on-exec, so programs the test starts never inherit one.
 *
 * Not a library for users: tests only. Functions return 0 or -1 (errno set).
 */
#ifndef OUTBOX_CHAOS_PROXY_H
#define OUTBOX_CHAOS_PROXY_H

#include <stdint.h>

typedef struct chaos_proxy chaos_proxy;

/* Starts a proxy to 127.0.0.1:target_port on listen_port (0: any free port); NULL on failure. */
chaos_proxy *chaos_proxy_start(int target_port, int listen_port);

/* Stops accepting, closes every connection, joins every thread, frees. NULL is a no-op. */
void chaos_proxy_free(chaos_proxy *proxy);

/* The port the proxy listens on. */
int chaos_proxy_port(const chaos_proxy *proxy);

/* Closes every connection open now, abruptly (RST). */
void chaos_proxy_cut(chaos_proxy *proxy);

/* Stops forwarding on every connection, old and new, until chaos_proxy_normal(). */
void chaos_proxy_stall(chaos_proxy *proxy);

/* Delays every forwarded chunk by delay_ms until chaos_proxy_normal(). */
void chaos_proxy_slow(chaos_proxy *proxy, int delay_ms);

/*
 * Makes every connection accepted from now on wait delay_ms before it
 * forwards its first byte (0: none): a connect that takes that long (a
 * distant server, a pooler, TLS), the connection fast once made. Not
 * undone by chaos_proxy_normal().
 */
void chaos_proxy_slow_connect(chaos_proxy *proxy, int delay_ms);

/* Back to plain forwarding. */
void chaos_proxy_normal(chaos_proxy *proxy);

/* Connections accepted so far. */
uint64_t chaos_proxy_accepted(const chaos_proxy *proxy);

#endif
