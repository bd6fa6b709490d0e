/*
 * stream.c - the stream pipeline threads: connect, take turns over the held
 * partitions (stream_partition.c), report lag, clean up, wait; and the
 * runner that starts, checks and stops them.
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
#include "ends.h"
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

/* ---- helpers ------------------------------------------------------------------- */

static void
runner_sleep_ms(struct stream_worker *sr, int ms)
{
    while (ms > 0 && !stream_worker_stopping(sr)) {
        int slice = ms < STREAM_SLEEP_SLICE_MS ? ms : STREAM_SLEEP_SLICE_MS;

        usleep((useconds_t)slice * 1000);
        ms -= slice;
    }
}

/* Closes a stream thread's database connection and the stream store on it. */
static void
close_store(struct stream_worker *sr)
{
    stream_store_free(sr->store);
    sr->store = NULL;
    outbox_store_free(sr->connection);
    sr->connection = NULL;
}

/*
 * Drops the database connection after a failure. The partitions stay held
 * in memory: after the reconnect their leases are renewed first (fenced, so
 * one that expired meanwhile is dropped) and their cursors read again (the
 * database may be a promoted standby by then, behind what this thread
 * published), and publishing goes on from them without waiting out a lease.
 */
static void
store_lost(struct stream_worker *sr, const struct outbox_error *err)
{
    log_event(OUTBOX_LOG_WARN, "stream database call failed", "thread=stream error=\"%s\"",
              err->message);
    close_store(sr);
    runner_sleep_ms(sr, STREAM_RETRY_MS); /* an error that stays must not spin */
}

/*
 * Opens the thread's database connection as every connection of the relay
 * is opened (database_open(): its notices logged under the thread's name,
 * the identity read, a changed history warned of), and the stream store on
 * it, whose statements keep generic plans. False with err when it could not.
 */
static bool
open_store(struct stream_worker *sr, struct outbox_error *err)
{
    const struct store_connect_options no_claims = {.prepare_lazily = true};
    const struct database_open how = {.url = sr->config->database_url,
                                      .worker_id = sr->owner,
                                      .who = sr->notice_who,
                                      .steps = &no_claims};

    sr->connection =
        database_open(sr->config, sr->runner->metrics, &how, &sr->identity, err);
    if (sr->connection == NULL)
        return false;
    sr->store = stream_store_borrow(outbox_store_conn(sr->connection), sr->owner, true, err);
    if (sr->store == NULL || stream_store_use_generic_plans(sr->store, err) != 0) {
        close_store(sr);
        return false;
    }
    return true;
}

/* Connects what is missing; false when it could not (the caller waits and retries). */
static bool
stream_connect_ends(struct stream_worker *sr)
{
    struct outbox_error err;

    if (sr->store == NULL) {
        if (!open_store(sr, &err)) {
            log_event(OUTBOX_LOG_WARN, "stream database connection failed",
                      "thread=stream error=\"%s\"", err.message);
            return false;
        }
        sr->next_renew = 0;
        sr->reload_cursors = true;
    }
    /* no broker connection while there is nothing to publish */
    if (sr->owned_count > 0 && !sink_is_connected(sr->sink) && sink_connect(sr->sink, &err) != 0) {
        log_event(OUTBOX_LOG_WARN, "stream broker connection failed", "thread=stream error=\"%s\"",
                  err.message);
        return false;
    }
    return true;
}

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

/*
 * Samples the lag of every partition and the transaction holding the
 * horizon for the gauges; logs lagging partitions and, when one lags, that
 * transaction.
 */
static int
report_lag(struct stream_worker *sr, struct outbox_error *err)
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

/* The lease work that is due; -1 with err when the database failed. */
static int
due_work(struct stream_worker *sr, struct outbox_error *err)
{
    if (clock_monotonic_seconds() >= sr->next_renew && stream_leases_turn(sr, err) != 0)
        return -1;
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

/*
 * True once a stream queue exists (stream_runner_check found one). Until
 * then the thread waits without a connection; false when it should return
 * instead (stopping, or --once and the check found none).
 */
static bool
wait_for_streams(struct stream_worker *sr)
{
    stream_runner *runner = sr->runner;

    while (!atomic_load(&runner->streams_seen)) {
        if (stream_worker_stopping(sr))
            return false;
        if (sr->config->once && atomic_load(&runner->checked))
            return false;
        runner_sleep_ms(sr, STREAM_CHECK_WAIT_MS); /* a flag: waiting costs nothing */
    }
    return !stream_worker_stopping(sr);
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

/*
 * The watch thread: the lag report and the cleanup on a connection of
 * their own, so that neither holds up a partition's publishing (the lag
 * count of a long backlog takes a while). With --once it runs them once.
 */
static void *
watch_run(void *arg)
{
    struct stream_worker *sr = arg;

    if (!wait_for_streams(sr))
        goto done;
    while (!stream_worker_stopping(sr)) {
        struct outbox_error err;
        double now = clock_monotonic_seconds(), next;

        if (!stream_connect_ends(sr)) {
            if (sr->config->once)
                break;
            runner_sleep_ms(sr, STREAM_RETRY_MS);
            continue;
        }
        if ((now >= sr->next_report && report_lag(sr, &err) != 0) ||
            (now >= sr->next_cleanup && stream_cleanup_turn(sr, &err) != 0)) {
            store_lost(sr, &err);
            continue;
        }
        if (sr->config->once)
            break;
        next = sr->next_report < sr->next_cleanup ? sr->next_report : sr->next_cleanup;
        now = clock_monotonic_seconds();
        if (next > now)
            runner_sleep_ms(sr, (int)((next - now) * 1000) + 1);
    }
done:
    close_store(sr);
    return NULL;
}

static void *
stream_run(void *arg)
{
    struct stream_worker *sr = arg;
    const struct relay_config *c = sr->config;
    int idle_ms = 0;
    double last_work = 0;

    if (!wait_for_streams(sr))
        goto done;
    while (!stream_worker_stopping(sr)) {
        struct outbox_error err;
        size_t rows = 0;

        if (!stream_connect_ends(sr)) {
            if (c->once)
                break;
            runner_sleep_ms(sr, STREAM_RETRY_MS);
            continue;
        }
        if (due_work(sr, &err) != 0) {
            store_lost(sr, &err);
            continue;
        }
        if (!stream_connect_ends(sr)) /* the broker, for partitions just taken */
            continue;
        if (stream_partitions_pass(sr, &rows, &err) != 0) {
            store_lost(sr, &err);
            continue;
        }
        if (rows > 0) {
            idle_ms = 0;
            last_work = clock_monotonic_seconds();
            continue;
        }
        if (c->once)
            break;
        idle_ms = idle_ms == 0 ? 1 : idle_ms * 2;
        if (clock_monotonic_seconds() - last_work < STREAM_BUSY_WINDOW_SECONDS &&
            idle_ms > STREAM_BUSY_POLL_MAX_MS)
            idle_ms = STREAM_BUSY_POLL_MAX_MS;
        if (idle_ms > c->poll_interval_ms)
            idle_ms = c->poll_interval_ms;
        runner_sleep_ms(sr, idle_ms);
    }
done:
    stream_worker_release_all(sr);
    sink_disconnect(sr->sink);
    close_store(sr);
    return NULL;
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
stream_worker_init(stream_runner *runner, struct stream_worker *sr, int index,
                   struct outbox_error *err)
{
    const struct relay_config *config = runner->config;
    size_t n = (size_t)config->batch_size;

    sr->runner = runner;
    sr->config = config;
    sr->owner = runner->owner;
    sr->index = index;
    sr->who = "thread=stream";
    snprintf(sr->notice_who, sizeof(sr->notice_who), "thread=stream index=%d", index);
    sr->acquired_log = OUTBOX_LOG_INFO;
    sr->lease_seconds = config->lease_seconds;
    sr->seed = (unsigned int)getpid() ^ (unsigned int)time(NULL) ^ (unsigned int)(index * 7919);
    if (index == runner->worker_count)
        return 0; /* the watch thread: no broker, no batches */
    /* a worker of a shared runner publishes through the broker its slot lends it */
    sr->sink = runner->workers != NULL ? config_sink_new(config, err) : NULL;
    if (runner->workers != NULL && sr->sink == NULL)
        return -1;
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
    sink_free(sr->sink);
    close_store(sr);
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

    if (runner == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        return NULL;
    }
    runner->config = config;
    runner->metrics = m;
    snprintf(runner->owner, sizeof(runner->owner), "%s/stream", worker_prefix);
    runner->worker_count = config->concurrency > 0 ? config->concurrency : 1;
    runner->workers = calloc((size_t)runner->worker_count + 1, sizeof(*runner->workers));
    if (runner->workers == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        goto fail;
    }
    for (int i = 0; i <= runner->worker_count; i++)
        if (stream_worker_init(runner, &runner->workers[i], i, err) != 0)
            goto fail;
    return runner;

fail:
    stream_runner_free(runner);
    return NULL;
}

void
stream_runner_free(stream_runner *runner)
{
    if (runner == NULL)
        return;
    for (int i = 0; runner->workers != NULL && i <= runner->worker_count; i++)
        stream_worker_clear(&runner->workers[i]);
    free(runner->workers);
    free(runner->queues);
    free(runner);
}

stream_runner *
stream_runner_new_shared(const struct relay_config *config, const char *worker_prefix,
                         struct metrics *m, struct outbox_error *err)
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
    runner->worker_count = 1; /* one worker a database: it takes every partition */
    return runner;
}

int
stream_runner_start(stream_runner *runner, struct outbox_error *err)
{
    for (int i = 0; i <= runner->worker_count; i++) {
        struct stream_worker *sr = &runner->workers[i];

        if (pthread_create(&sr->thread, NULL, i < runner->worker_count ? stream_run : watch_run,
                           sr) != 0) {
            stream_runner_stop(runner);
            return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "unable to start stream thread %d",
                                    i);
        }
        sr->started = true;
    }
    return 0;
}

int
stream_runner_check(stream_runner *runner, PGconn *conn, struct outbox_error *err)
{
    bool exists = false;

    if (runner == NULL || atomic_load(&runner->streams_seen))
        return 0;
    if (stream_admin_exists(conn, runner->workers[0].queues, &exists, err) != 0)
        return -1;
    if (exists) {
        log_event(OUTBOX_LOG_INFO, "stream queues found: the stream threads connect",
                  "threads=%d", runner->worker_count);
        atomic_store(&runner->streams_seen, 1);
    }
    atomic_store(&runner->checked, 1);
    return 0;
}

void
stream_runner_checks_over(stream_runner *runner)
{
    if (runner != NULL)
        atomic_store(&runner->checked, 1);
}

void
stream_runner_stop(stream_runner *runner)
{
    if (runner != NULL)
        atomic_store(&runner->stopping, 1);
}

void
stream_runner_join(stream_runner *runner)
{
    for (int i = 0; runner != NULL && i <= runner->worker_count; i++) {
        if (runner->workers[i].started)
            pthread_join(runner->workers[i].thread, NULL);
        runner->workers[i].started = false;
    }
}
