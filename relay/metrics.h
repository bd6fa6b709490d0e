/*
 * metrics.h - the relay's Prometheus metrics and health state.
 *
 * A fixed set of metric families (no registration at run time), rendered in
 * Prometheus text format 0.0.4 by metrics_render(). Counters and gauges
 * labelled by queue create the queue's series on first use, up to a cap
 * (metrics_set_max_queues): the queues after it share one series,
 * queue="(other)" (no queue name holds parentheses), so per-tenant queue
 * names cannot grow /metrics without bound; outbox_metrics_queues_folded
 * counts them. An optional constant label (broker="amqp" or "redis") is put
 * on every series.
 *
 * Health is pushed by the relay, never probed: it reports each successful
 * round trip to the database and the broker (metrics_round_trip: a
 * statement's result, a broker's confirm or reply, a connect), the
 * connection state (metrics_set_up) and that its loop turned
 * (metrics_loop_turned). An end is up while any thread had a round trip
 * with it within the round-trip window, whatever another thread's
 * connection says: rows move as long as one does. metrics_health() says
 * healthy when both ends are up and the loop turned within
 * METRICS_HEALTH_STALE_SECONDS by the metrics clock. Until the relay
 * reports, it is unhealthy.
 *
 * Every function is thread-safe (one mutex; update once per batch, not per
 * row, on hot paths). Update functions ignore a NULL struct metrics, so code
 * can run with metrics off.
 */
#ifndef OUTBOX_METRICS_H
#define OUTBOX_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrics_database.h"
#include "metrics_families.h"
#include "metrics_stream.h"
#include "timeouts.h" /* METRICS_HEALTH_STALE_SECONDS, METRICS_ROUND_TRIP_MIN_WINDOW_SECONDS */

/*
 * An end is down when no round trip with it succeeded within the window:
 * ROUND_TRIP_IDLE_FACTOR times the longest idle wait between round trips
 * (--poll-interval), and never less than METRICS_ROUND_TRIP_MIN_WINDOW_SECONDS
 * (the maintenance phases and the broker's idle service make round trips
 * every few seconds while no row moves).
 */
#define METRICS_ROUND_TRIP_IDLE_FACTOR 3.0

struct metrics;

/*
 * Creates an empty registry. broker is the value of the constant label
 * broker="..." (NULL for none). Returns NULL when out of memory.
 */
struct metrics *metrics_new(const char *broker);
void metrics_free(struct metrics *m);

/*
 * Replaces the clock used for health (seconds, any fixed origin; the default
 * is CLOCK_MONOTONIC). For tests. now(context) must be thread-safe.
 */
void metrics_set_clock(struct metrics *m, double (*now)(void *context), void *context);

/* The queue label value of the series that sums every queue past the cap. */
#define METRICS_OTHER_QUEUE "(other)"

/* The default of --metrics-max-queues. */
#define METRICS_DEFAULT_MAX_QUEUES 100

/*
 * Keeps at most max_queues queues' own series (the first seen); 0 keeps
 * every queue. Call before the first update; the default is no cap.
 */
void metrics_set_max_queues(struct metrics *m, size_t max_queues);

/* Adds n to a queue-labelled counter (queue NULL counts as ""). */
void metrics_add_queue(struct metrics *m, enum metrics_queue_counter counter, const char *queue,
                       uint64_t n);

/* Adds n to an unlabelled counter. */
void metrics_add(struct metrics *m, enum metrics_counter counter, uint64_t n);

/* Counts one reconnect to target (outbox_reconnects_total{target}). */
void metrics_reconnected(struct metrics *m, enum metrics_target target);

/* Adds delta (may be negative) to outbox_rows_in_flight. */
void metrics_add_in_flight(struct metrics *m, int64_t delta);

/*
 * Replaces the backlog gauges outbox_ready_rows{queue},
 * outbox_oldest_ready_age_seconds{queue}, outbox_queue_paused{queue} and
 * outbox_queue_paused_keys{queue} with one sample of all queues:
 * queues seen before but absent from samples drop to 0.
 */
void metrics_set_queue_samples(struct metrics *m, const struct metrics_queue_sample *samples,
                               size_t count);

/* Replaces the table gauges with one sample (all 0 until the first). */
void metrics_set_table_sample(struct metrics *m, const struct metrics_table_sample *sample);

/* Records one observation in seconds, or count of them at once. */
void metrics_observe(struct metrics *m, enum metrics_histogram histogram, double seconds);
void metrics_observe_many(struct metrics *m, enum metrics_histogram histogram,
                          const double *seconds, size_t count);

/*
 * Sets outbox_up{target} (1 or 0) as the last connect or loss of any thread
 * left it. A connect (up) is a round trip too; a loss alone makes no end
 * down while another thread's round trips go on.
 */
void metrics_set_up(struct metrics *m, enum metrics_target target, bool up);

/* Records a successful round trip with target now (by the metrics clock). */
void metrics_round_trip(struct metrics *m, enum metrics_target target);

/*
 * Sets the round-trip window from the longest idle wait between round trips
 * (seconds): max(METRICS_ROUND_TRIP_IDLE_FACTOR x it,
 * METRICS_ROUND_TRIP_MIN_WINDOW_SECONDS), the default before the call.
 */
void metrics_set_idle_wait(struct metrics *m, double seconds);

/*
 * Writes one line per end, "database: last round trip 0.4 s ago\n" (or
 * "...: no round trip yet\n"), for /healthz; truncated to size.
 */
void metrics_describe_ends(struct metrics *m, char *text, size_t size);

/*
 * Names the broker endpoints ("host:port", never a secret) in the URL's
 * order, at most METRICS_MAX_ENDPOINTS; each gets an outbox_broker_endpoint
 * series at 0. Call once, before the pipelines start. 0, or -1 when out of
 * memory.
 */
int metrics_set_endpoints(struct metrics *m, const char *const *names, size_t count);

/* Adds delta (+1 at a connect, -1 at a loss) to the connections on endpoint index. */
void metrics_add_endpoint_connections(struct metrics *m, size_t index, int delta);

/* Records that the relay loop turned now (by the metrics clock). */
void metrics_loop_turned(struct metrics *m);

/*
 * Shorthand for a relay with one connection per end (and tests): both up
 * flags, a round trip now of each end that is up while one that is not has
 * none (so it is down at once), then metrics_loop_turned().
 */
void metrics_set_health(struct metrics *m, bool database_up, bool broker_up);

/*
 * Says why the broker holds every row of the last batch back (a Redis
 * primary without enough replicas for --redis-wait, ...), or NULL once it
 * takes rows again. While set, health is "broker holds rows back: <reason>".
 */
void metrics_set_broker_held(struct metrics *m, const char *reason);

/*
 * Replaces the stream gauges with one sample of every stream partition (in
 * queue order) and the transaction holding the stream horizon (see
 * metrics_stream.h; the queue cap of metrics_set_max_queues applies).
 */
void metrics_set_stream_sample(struct metrics *m, const struct metrics_stream_partition *partitions,
                               size_t count, const struct metrics_stream_horizon *horizon);

/* Sets outbox_xmin_horizon_age_seconds: the oldest open transaction's age, 0 when none. */
void metrics_set_horizon_age(struct metrics *m, double seconds);

/*
 * True when the relay loop turned within METRICS_HEALTH_STALE_SECONDS,
 * whether or not both ends are up: the liveness half of health, which a
 * service manager's watchdog follows (a restart cannot bring a database
 * back, but it does unstick a stalled loop).
 */
bool metrics_loop_alive(struct metrics *m);

/*
 * True when the relay loop turned once and then not for more than
 * METRICS_HEALTH_STALE_SECONDS (*seconds: since its last turn): a stuck
 * process, what /livez answers 503 for. Waiting for an end that is down
 * turns the loop (each reconnect attempt), so an outage is not a stall.
 */
bool metrics_loop_stalled(struct metrics *m, double *seconds);

/*
 * True when healthy. When not, and reason is not NULL, writes a short
 * lowercase reason ("broker down", "loop stalled for 42 s", ...): an end
 * is down when it had no round trip within the window, or none at all
 * after a failed connect. ready (may be NULL) is set to whether both ends
 * are up, ignoring the loop.
 */
bool metrics_health(struct metrics *m, char *reason, size_t reason_size, bool *ready);

/*
 * Renders every family in Prometheus text format 0.0.4 into a malloc'd,
 * NUL-terminated buffer (length in *length when not NULL). NULL when out of
 * memory. The caller frees it.
 */
char *metrics_render(struct metrics *m, size_t *length);

/* The per-database series of a relay serving --databases (metrics_database.h); NULL for NULL. */
struct metrics_databases *metrics_databases_of(struct metrics *m);

#endif
