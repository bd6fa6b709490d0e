/*
 * stream.c - a database's stream worker between its partitions' turns
 * (stream_partition.c): its lag report, its cleanup, a pass over the held
 * partitions, giving them back; and the runner its workers share. The slot
 * serving the database runs its worker (scheduler_stream.c).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "buffer.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "metrics.h"
#include "sink.h"
#include "store_stream.h"
#include "stream.h"
#include "stream_worker.h"
#include "timeouts.h"

/* Published rows are deleted every STREAM_CLEANUP_SECONDS, at most this many a statement. */
#define STREAM_CLEANUP_ROWS 5000

/* ---- between turns --------------------------------------------------------------- */

/* Hands the lag of every partition and the horizon to the stream gauges. */
static void
lag_metrics(struct stream_worker *sr, const struct stream_lag *lag, size_t count,
            const struct stream_horizon *horizon)
{
    struct metrics_stream_partition *partitions = calloc(count > 0 ? count : 1,
                                                         sizeof(*partitions));
    struct metrics_stream_horizon h = {.found = horizon->found,
                                       .pid = horizon->pid,
                                       .prepared = horizon->prepared[0] != '\0',
                                       .age_seconds = horizon->seconds};

    if (partitions == NULL)
        return; /* the gauges keep the last sample */
    for (size_t i = 0; i < count; i++)
        partitions[i] = (struct metrics_stream_partition){
            .queue = lag[i].queue,
            .partition = lag[i].partition,
            .owner = lag[i].owner,
            .lag_rows = lag[i].rows,
            .lag_seconds = lag[i].seconds,
        };
    metrics_set_stream_sample(sr->runner->metrics, partitions, count, &h);
    free(partitions);
}

int
stream_report_lag(struct stream_worker *sr, struct outbox_error *err)
{
    struct stream_lag *lag = NULL;
    struct stream_horizon horizon;
    size_t count = 0;
    bool lagging = false;
    double threshold = sr->config->horizon_warning_seconds > 0 ? sr->config->horizon_warning_seconds
                                                                : STREAM_LAG_WARNING_SECONDS;

    sr->next_report = clock_monotonic_seconds() + STREAM_REPORT_SECONDS;
    if (stream_store_lag(sr->store, &lag, &count, err) != 0)
        return -1;
    if (stream_store_horizon(sr->store, &horizon, err) != 0) {
        free(lag);
        return -1;
    }
    lag_metrics(sr, lag, count, &horizon);
    for (size_t i = 0; i < count; i++) {
        if (lag[i].seconds < threshold)
            continue;
        lagging = true;
        log_event(OUTBOX_LOG_WARN, "stream partition lags",
                  "queue=%s partition=%d rows=%lld seconds=%.1f owner=%s", lag[i].queue,
                  lag[i].partition, (long long)lag[i].rows, lag[i].seconds,
                  lag[i].owner[0] != '\0' ? lag[i].owner : "none");
    }
    free(lag);
    if (lagging && horizon.found && horizon.prepared[0] != '\0')
        log_event(OUTBOX_LOG_WARN, "a prepared transaction holds the stream horizon",
                  "gid=\"%s\" owner=%s database=%s seconds=%.1f"
                  " hint=\"end it with COMMIT PREPARED or ROLLBACK PREPARED of that gid\"",
                  horizon.prepared, horizon.user, horizon.database, horizon.seconds);
    else if (lagging && horizon.found)
        log_event(OUTBOX_LOG_WARN, "a transaction holds the stream horizon",
                  "pid=%d seconds=%.1f user=%s database=%s application=\"%s\" query=\"%s\"",
                  horizon.pid, horizon.seconds, horizon.user, horizon.database,
                  horizon.application, horizon.query);
    return 0;
}

int
stream_cleanup_turn(struct stream_worker *sr, struct outbox_error *err)
{
    size_t rows = 0, keys = 0;

    sr->next_cleanup = clock_monotonic_seconds() + STREAM_CLEANUP_SECONDS;
    if (stream_store_key_cleanup(sr->store, STREAM_CLEANUP_ROWS, &keys, err) != 0)
        return -1;
    if (sr->config->retention_seconds > 0 &&
        stream_store_cleanup(sr->store, sr->config->retention_seconds, STREAM_CLEANUP_ROWS, &rows,
                             err) != 0)
        return -1;
    if (rows == STREAM_CLEANUP_ROWS || keys == STREAM_CLEANUP_ROWS)
        sr->next_cleanup = 0; /* more to delete */
    return 0;
}

int
stream_partitions_pass(struct stream_worker *sr, size_t *rows, struct outbox_error *err)
{
    double now = clock_monotonic_seconds();

    *rows = 0;
    for (size_t k = 0; k < sr->owned_count && !stream_worker_stopping(sr); k++) {
        size_t read = 0, i = (sr->next_turn + k) % sr->owned_count;

        /* out of time after a turn at least: the next pass starts where this one stopped */
        if (k > 0 && sr->turn_until > 0 && clock_monotonic_seconds() >= sr->turn_until) {
            sr->next_turn = i;
            break;
        }
        if (sr->owned[i].wait_until > now)
            continue;
        if (stream_partition_turn(sr, i, &read, err) != 0)
            return -1;
        *rows += read;
        if (!sink_is_connected(sr->sink))
            break;
    }
    return 0;
}

void
stream_worker_release_all(struct stream_worker *sr)
{
    struct outbox_error err;

    for (size_t i = 0; sr->store != NULL && i < sr->owned_count; i++)
        if (stream_store_release(sr->store, &sr->owned[i].p, &err) != 0)
            break;
    if (sr->store != NULL)
        (void)stream_store_leave(sr->store, &err); /* else it expires after a lease */
    sr->owned_count = 0;
}

/* ---- lifecycle ------------------------------------------------------------------- */

/* --queues as a text[] literal (queue names need no quoting: A-Z a-z 0-9 . _ : -). */
static int
queues_literal(const struct relay_config *config, char **out)
{
    struct buffer b = {0};

    *out = NULL;
    if (config->queue_count == 0)
        return 0;
    buffer_putc(&b, '{');
    for (size_t i = 0; i < config->queue_count; i++) {
        if (i > 0)
            buffer_putc(&b, ',');
        buffer_printf(&b, "\"%s\"", config->queues[i]);
    }
    buffer_putc(&b, '}');
    if (b.failed) {
        buffer_clear(&b);
        return -1;
    }
    *out = b.data;
    return 0;
}

int
stream_worker_init(stream_runner *runner, struct stream_worker *sr, struct outbox_error *err)
{
    const struct relay_config *config = runner->config;
    size_t n = (size_t)config->batch_size;

    sr->runner = runner;
    sr->config = config;
    sr->owner = runner->owner;
    sr->who = "thread=stream";
    sr->acquired_log = OUTBOX_LOG_INFO;
    sr->modulus = 1; /* every partition */
    sr->lease_seconds = config->lease_seconds;
    sr->seed = (unsigned int)getpid() ^ (unsigned int)time(NULL);
    sr->messages = calloc(n, sizeof(*sr->messages));
    sr->cloudevents = cloudevents_new(config->cloudevents, config->cloudevents_source);
    sr->otel = otel_enabled() ? otel_batch_new() : NULL;
    sr->places = calloc(n, sizeof(*sr->places));
    sr->outcomes = calloc(n, sizeof(*sr->outcomes));
    sr->refusals = calloc(n, sizeof(*sr->refusals));
    sr->lags = calloc(n, sizeof(*sr->lags));
    sr->verdicts = calloc(n, sizeof(*sr->verdicts));
    if ((sr->cloudevents == NULL && config->cloudevents != CLOUDEVENTS_OFF) ||
        (sr->otel == NULL && otel_enabled()) ||
        sr->messages == NULL || sr->places == NULL || sr->outcomes == NULL ||
        sr->refusals == NULL || sr->lags == NULL || sr->verdicts == NULL ||
        queues_literal(config, &sr->queues) != 0)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    return 0;
}

void
stream_worker_clear(struct stream_worker *sr)
{
    stream_store_free(sr->store);
    sr->store = NULL;
    free(sr->messages);
    cloudevents_free(sr->cloudevents);
    otel_batch_free(sr->otel);
    free(sr->places);
    free(sr->outcomes);
    free(sr->refusals);
    free(sr->lags);
    free(sr->verdicts);
    free(sr->queues);
}

stream_runner *
stream_runner_new(const struct relay_config *config, const char *worker_prefix, struct metrics *m,
                  struct outbox_error *err)
{
    stream_runner *runner = calloc(1, sizeof(*runner));

    if (runner == NULL || queues_literal(config, &runner->queues) != 0) {
        free(runner);
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        return NULL;
    }
    runner->config = config;
    runner->metrics = m;
    snprintf(runner->owner, sizeof(runner->owner), "%s/stream", worker_prefix);
    return runner;
}

void
stream_runner_free(stream_runner *runner)
{
    if (runner == NULL)
        return;
    free(runner->queues);
    free(runner);
}

void
stream_runner_stop(stream_runner *runner)
{
    if (runner != NULL)
        atomic_store(&runner->stopping, 1);
}
