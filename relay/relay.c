/*
 * relay.c - claim, publish, mark: the pipelines of outbox-relay.
 */
#include "relay.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <uuid/uuid.h>

#include "error.h"
#include "log.h"
#include "outbox.h"
#include "sink.h"

/* While rows keep coming, an empty claim waits at most this long before the next. */
#define BUSY_POLL_MAX_MS 8
#define BUSY_WINDOW_SECONDS 1.0
/* Pipelines check the stop flag at least this often while waiting. */
#define WAIT_SLICE_MS 100
/* Reconnect backoff: from the first to the longest wait. */
#define RECONNECT_FIRST_MS 200
#define RECONNECT_MAX_MS 10000
/* Maintenance cadence of pipeline 0, and its bounded batch sizes. */
#define REAP_EVERY_SECONDS 5.0
#define REAP_LIMIT 1000
#define REAP_RETRY_SECONDS 1.0
#define SWEEP_KEY_LIMIT 1000
#define CLEANUP_EVERY_SECONDS 60.0
#define CLEANUP_LIMIT 5000
#define CLEANUP_MAX_ROUNDS 20
#define SAMPLE_EVERY_SECONDS 15.0
/* The broker connection is serviced (heartbeats) at least this often when idle. */
#define SINK_IDLE_EVERY_SECONDS 1.0

struct pipeline {
    relay *relay;
    int index;
    pthread_t thread;
    bool started;
    char worker_id[192];
    outbox_store *store;
    sink *sink;
    unsigned int seed; /* for retry jitter */

    /* per-batch scratch, sized for --batch-size */
    struct sink_message *messages;
    struct sink_outcome *outcomes;
    struct outbox_lease *leases;
    struct outbox_failure *failures;
    bool *done;
    bool *dead;
    const char **lease_queues;   /* queue of leases[i] */
    const char **failure_queues; /* queue of failures[i] */
    double *lags;                /* commit-to-publish seconds of accepted rows */

    double next_reap;
    double next_cleanup;
    double next_sample;
    double last_sink_idle;
};

struct relay {
    const struct relay_config *config;
    struct metrics *metrics;
    char worker_prefix[160];
    struct pipeline *pipelines;
    atomic_int stopping;
    atomic_int running; /* pipelines not yet returned */
    atomic_int fatal;
    pthread_mutex_t fatal_lock;
    struct outbox_error fatal_error;
};

/* Monotonic seconds. */
static double
now_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Wall-clock seconds since the epoch, to compare with created_at. */
static double
wall_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static bool
stopping(const relay *r)
{
    return atomic_load(&r->stopping) || atomic_load(&r->fatal);
}

/* Sleeps up to ms in slices, returning early when the relay stops. */
static void
sleep_ms(relay *r, int ms)
{
    while (ms > 0 && !stopping(r)) {
        int slice = ms < WAIT_SLICE_MS ? ms : WAIT_SLICE_MS;

        usleep((useconds_t)slice * 1000);
        ms -= slice;
    }
}

/* Records the first fatal error and stops every pipeline. */
static void
set_fatal(relay *r, const struct outbox_error *err)
{
    pthread_mutex_lock(&r->fatal_lock);
    if (!atomic_load(&r->fatal)) {
        r->fatal_error = *err;
        atomic_store(&r->fatal, 1);
    }
    pthread_mutex_unlock(&r->fatal_lock);
}

/* The next reconnect wait: doubling, capped, with jitter. */
static int
next_backoff_ms(struct pipeline *p, int attempt)
{
    double seconds = outbox_backoff_seconds(attempt, RECONNECT_FIRST_MS / 1000.0,
                                            RECONNECT_MAX_MS / 1000.0,
                                            (double)rand_r(&p->seed) / ((double)RAND_MAX + 1));

    return (int)(seconds * 1000);
}

/* ---- connections ------------------------------------------------------------ */

/*
 * libpq hands what the server says outside a query result (a WARNING from a
 * user's trigger, the FATAL sent to idle sessions at shutdown) to a notice
 * processor whose default writes it raw to stderr, in the middle of the log.
 * This one makes it a log event of the pipeline, rate-limited.
 */
static void
log_database_notice(void *arg, const char *message)
{
    const struct pipeline *p = arg;
    size_t len = strlen(message);

    while (len > 0 && (message[len - 1] == '\n' || message[len - 1] == ' '))
        len--;
    log_event_limited("database-notice", OUTBOX_LOG_WARN, "database notice",
                      "pipeline=%d notice=\"%.*s\"", p->index, (int)len, message);
}

/*
 * Connects the store until it works, the relay stops, or a fatal error
 * (bad password, no schema) at first start. Returns 0 when connected.
 */
static int
connect_store(struct pipeline *p, bool first)
{
    relay *r = p->relay;

    for (int attempt = 1; !stopping(r); attempt++) {
        struct outbox_error err;

        p->store = outbox_store_connect(r->config->database_url, p->worker_id, &err);
        if (p->store != NULL) {
            PQsetNoticeProcessor(outbox_store_conn(p->store), log_database_notice, p);
            outbox_store_set_block_on_dead_head(p->store, r->config->block_on_dead_head);
            metrics_set_up(r->metrics, METRICS_DATABASE, true);
            if (attempt > 1 || !first)
                log_event(OUTBOX_LOG_INFO, "database connected", "pipeline=%d attempts=%d",
                          p->index, attempt);
            return 0;
        }
        metrics_set_up(r->metrics, METRICS_DATABASE, false);
        if (first && !outbox_error_is_transient(&err)) {
            set_fatal(r, &err);
            return -1;
        }
        log_event_limited("database-connect", OUTBOX_LOG_WARN, "database unavailable, retrying",
                          "pipeline=%d error=\"%s\"", p->index, err.message);
        metrics_reconnected(r->metrics, METRICS_DATABASE);
        sleep_ms(r, next_backoff_ms(p, attempt));
    }
    return -1;
}

static void
drop_store(struct pipeline *p)
{
    outbox_store_free(p->store);
    p->store = NULL;
    metrics_set_up(p->relay->metrics, METRICS_DATABASE, false);
}

/* Like connect_store, for the broker. */
static int
connect_sink(struct pipeline *p, bool first)
{
    relay *r = p->relay;

    for (int attempt = 1; !stopping(r); attempt++) {
        struct outbox_error err;

        if (sink_connect(p->sink, &err) == 0) {
            metrics_set_up(r->metrics, METRICS_BROKER, true);
            p->last_sink_idle = now_seconds();
            if (attempt > 1 || !first)
                log_event(OUTBOX_LOG_INFO, "broker connected", "pipeline=%d broker=%s attempts=%d",
                          p->index, sink_display_url(p->sink), attempt);
            return 0;
        }
        metrics_set_up(r->metrics, METRICS_BROKER, false);
        if (first && !outbox_error_is_transient(&err)) {
            set_fatal(r, &err);
            return -1;
        }
        log_event_limited("broker-connect", OUTBOX_LOG_WARN, "broker unavailable, retrying",
                          "pipeline=%d broker=%s error=\"%s\"", p->index,
                          sink_display_url(p->sink), err.message);
        metrics_reconnected(r->metrics, METRICS_BROKER);
        sleep_ms(r, next_backoff_ms(p, attempt));
    }
    return -1;
}

/*
 * Reacts to a failed store call. A missing schema or refused credentials stop
 * the relay; anything else (a lost connection, a timeout, a statement the
 * server rejected) drops the connection and carries on after reconnecting:
 * the rows involved keep their lease and come back after it, never lost.
 */
static void
store_failed(struct pipeline *p, const struct outbox_error *err)
{
    if (err->code == OUTBOX_ERR_SCHEMA || err->code == OUTBOX_ERR_CONFIG) {
        set_fatal(p->relay, err);
        return;
    }
    log_event_limited("database-error", outbox_error_is_transient(err) ? OUTBOX_LOG_WARN
                                                                         : OUTBOX_LOG_ERROR,
                      "database error, reconnecting", "pipeline=%d error=\"%s\"", p->index,
                      err->message);
    drop_store(p);
}

/* ---- one batch -------------------------------------------------------------- */

/* Keeps a broker's reason printable ASCII, so the database always takes it as text. */
static void
sanitize_reason(char *reason)
{
    for (unsigned char *c = (unsigned char *)reason; *c != '\0'; c++)
        if (*c < 0x20 || *c > 0x7e)
            *c = '?';
}

/* Fills the failure of one message from its sink outcome. */
static void
add_failure(struct pipeline *p, size_t n, const struct outbox_job *job,
            struct sink_outcome *outcome)
{
    const struct relay_config *c = p->relay->config;

    sanitize_reason(outcome->reason);
    p->failures[n] = (struct outbox_failure){
        .job_id = job->job_id,
        .generation = job->generation,
        .error = outcome->reason[0] ? outcome->reason : "publish failed",
        .retry_seconds =
            outbox_backoff_seconds(job->generation, c->retry_base_seconds, c->retry_max_seconds,
                                   (double)rand_r(&p->seed) / ((double)RAND_MAX + 1)),
        .permanent = outcome->status == SINK_REJECTED,
    };
}

/*
 * Marks the confirmed rows succeeded. If the database is gone, reconnects
 * once and tries again while the leases may still hold; rows it cannot mark
 * stay running and are re-published after their lease (at least once).
 */
static void
complete_accepted(struct pipeline *p, size_t accepted)
{
    relay *r = p->relay;
    struct outbox_error err;
    size_t changed = 0;

    if (accepted == 0)
        return;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (p->store == NULL && connect_store(p, false) != 0)
            return;
        if (outbox_complete(p->store, p->leases, accepted, p->done, &changed, &err) == 0)
            break;
        store_failed(p, &err);
        if (p->store != NULL)
            return; /* fatal */
    }
    for (size_t i = 0; i < accepted; i++)
        if (p->done[i])
            metrics_add_queue(r->metrics, METRICS_ROWS_COMPLETED, p->lease_queues[i], 1);
    if (changed < accepted) {
        metrics_add(r->metrics, METRICS_LEASE_LOST, accepted - changed);
        for (size_t i = 0; i < accepted; i++)
            if (!p->done[i])
                log_event_limited("lease-lost", OUTBOX_LOG_WARN,
                                  "lease lost before marking a published row",
                                  "pipeline=%d job_id=%lld", p->index,
                                  (long long)p->leases[i].job_id);
    }
}

static void
fail_rejected(struct pipeline *p, size_t failed)
{
    relay *r = p->relay;
    struct outbox_error err;
    size_t changed = 0, dead = 0;

    if (failed == 0 || p->store == NULL)
        return;
    if (outbox_fail(p->store, p->failures, failed, p->done, p->dead, &changed, &err) != 0) {
        /* the rows keep their lease and come back after it: nothing is lost */
        store_failed(p, &err);
        return;
    }
    for (size_t i = 0; i < failed; i++) {
        if (!p->done[i])
            continue;
        /* a row's last attempt counts as dead only, as the metric's help says */
        if (p->dead[i]) {
            dead++;
            metrics_add_queue(r->metrics, METRICS_ROWS_DEAD, p->failure_queues[i], 1);
            log_event(OUTBOX_LOG_ERROR, "row is dead", "pipeline=%d job_id=%lld error=\"%s\"",
                      p->index, (long long)p->failures[i].job_id, p->failures[i].error);
        } else {
            metrics_add_queue(r->metrics, METRICS_ROWS_FAILED, p->failure_queues[i], 1);
            log_event_limited("publish-failed", OUTBOX_LOG_WARN, "publish failed, will retry",
                              "pipeline=%d job_id=%lld retry_in=%.1fs error=\"%s\"", p->index,
                              (long long)p->failures[i].job_id, p->failures[i].retry_seconds,
                              p->failures[i].error);
        }
    }
    if (changed < failed)
        metrics_add(r->metrics, METRICS_LEASE_LOST, failed - changed);
}

/* Publishes one claimed batch and records the outcome of every row. */
static void
process_batch(struct pipeline *p, const struct outbox_batch *batch, double claimed_at)
{
    relay *r = p->relay;
    size_t accepted = 0, failed = 0;
    struct outbox_error err;
    double started, finished, wall;
    int rc;

    for (size_t i = 0; i < batch->count; i++) {
        const struct outbox_job *job = &batch->jobs[i];

        p->messages[i] = (struct sink_message){
            .job_id = job->job_id,
            .attempt = job->generation,
            .queue = job->queue,
            .payload = job->payload,
            .payload_len = job->payload_len,
            .headers = job->headers,
            .created_at = job->created_at,
        };
        metrics_add_queue(r->metrics, METRICS_ROWS_CLAIMED, job->queue, 1);
    }

    /* a batch that waited long for its broker gets a fresh lease before publishing */
    if (now_seconds() - claimed_at > r->config->lease_seconds / 2.0) {
        size_t changed;

        for (size_t i = 0; i < batch->count; i++)
            p->leases[i] = (struct outbox_lease){batch->jobs[i].job_id, batch->jobs[i].generation};
        if (outbox_extend(p->store, p->leases, batch->count, r->config->lease_seconds, p->done,
                          &changed, &err) != 0)
            log_event(OUTBOX_LOG_WARN, "unable to extend leases", "pipeline=%d error=\"%s\"",
                      p->index, err.message);
    }

    metrics_add_in_flight(r->metrics, (int64_t)batch->count);
    started = now_seconds();
    rc = sink_publish(p->sink, p->messages, batch->count, p->outcomes, &err);
    finished = now_seconds();
    wall = wall_seconds();
    metrics_observe(r->metrics, METRICS_PUBLISH_DURATION, finished - started);
    if (rc != 0) {
        log_event_limited("broker-error", OUTBOX_LOG_WARN, "broker connection lost",
                          "pipeline=%d broker=%s error=\"%s\"", p->index,
                          sink_display_url(p->sink), err.message);
        metrics_set_up(r->metrics, METRICS_BROKER, false);
    }

    for (size_t i = 0; i < batch->count; i++) {
        const struct outbox_job *job = &batch->jobs[i];

        if (p->outcomes[i].status == SINK_ACCEPTED) {
            p->lease_queues[accepted] = job->queue;
            p->lags[accepted] = wall - job->created_at;
            p->leases[accepted++] = (struct outbox_lease){job->job_id, job->generation};
            metrics_add_queue(r->metrics, METRICS_ROWS_PUBLISHED, job->queue, 1);
        } else {
            p->failure_queues[failed] = job->queue;
            add_failure(p, failed++, job, &p->outcomes[i]);
        }
    }
    metrics_observe_many(r->metrics, METRICS_COMMIT_TO_PUBLISH, p->lags, accepted);
    complete_accepted(p, accepted);
    fail_rejected(p, failed);
    metrics_add_in_flight(r->metrics, -(int64_t)batch->count);
}

/* ---- maintenance (pipeline 0) ----------------------------------------------- */

/* Collects backlog samples; queue names are copied out of the result. */
struct samples {
    struct metrics_queue_sample *items;
    size_t count;
    size_t capacity;
};

static void
record_backlog(void *arg, const struct outbox_backlog *backlog)
{
    struct samples *s = arg;

    if (s->count == s->capacity) {
        size_t capacity = s->capacity ? s->capacity * 2 : 16;
        struct metrics_queue_sample *items = realloc(s->items, capacity * sizeof(*items));

        if (items == NULL)
            return; /* a sample short of a queue only leaves its gauge at 0 */
        s->items = items;
        s->capacity = capacity;
    }
    s->items[s->count].queue = strdup(backlog->queue);
    if (s->items[s->count].queue == NULL)
        return;
    s->items[s->count].ready_rows = backlog->ready;
    s->items[s->count].oldest_ready_age_seconds = backlog->oldest_ready_age;
    s->count++;
}

/* Samples the backlog for the gauges, and warns about an old open transaction. */
static void
relay_sample(struct pipeline *p)
{
    relay *r = p->relay;
    struct outbox_horizon horizon;
    struct outbox_error err;

    struct samples samples = {0};
    int rc = outbox_sample_backlog(p->store, record_backlog, &samples, &err);

    if (rc == 0)
        metrics_set_queue_samples(r->metrics, samples.items, samples.count);
    for (size_t i = 0; i < samples.count; i++)
        free((char *)samples.items[i].queue);
    free(samples.items);
    if (rc != 0) {
        store_failed(p, &err);
        return;
    }
    if (outbox_sample_horizon(p->store, &horizon, &err) != 0) {
        store_failed(p, &err);
        return;
    }
    if (horizon.found && r->config->horizon_warning_seconds > 0 &&
        horizon.age_seconds > r->config->horizon_warning_seconds)
        log_event_limited("xmin-horizon", OUTBOX_LOG_WARN,
                          "an open transaction holds back vacuum; the queue will slow down",
                          "age=%.0fs pid=%d application=\"%s\" state=\"%s\"",
                          horizon.age_seconds, horizon.pid, horizon.application, horizon.state);
}

static void
maintain(struct pipeline *p, bool force)
{
    relay *r = p->relay;
    double now = now_seconds();
    struct outbox_error err;

    if (force || now >= p->next_reap) {
        struct outbox_reap_result reaped;

        p->next_reap = now + REAP_EVERY_SECONDS;
        do {
            if (outbox_reap(p->store, REAP_LIMIT, REAP_RETRY_SECONDS, &reaped, &err) != 0) {
                store_failed(p, &err);
                return;
            }
            if (reaped.ready + reaped.dead > 0)
                log_event(OUTBOX_LOG_INFO, "reaped expired leases", "ready=%zu dead=%zu",
                          reaped.ready, reaped.dead);
            metrics_add(r->metrics, METRICS_ROWS_REAPED, reaped.ready + reaped.dead);
        } while (reaped.ready + reaped.dead == REAP_LIMIT && !stopping(r));
        {
            size_t released = 0;

            if (outbox_release_waiting(p->store, SWEEP_KEY_LIMIT, &released, &err) != 0) {
                store_failed(p, &err);
                return;
            }
            if (released > 0)
                log_event(OUTBOX_LOG_INFO, "released rows waiting for a finished key",
                          "rows=%zu", released);
        }
    }
    if (r->config->retention_seconds > 0 && now >= p->next_cleanup) {
        size_t deleted = 0, total = 0;

        p->next_cleanup = now + CLEANUP_EVERY_SECONDS;
        for (int round = 0; round < CLEANUP_MAX_ROUNDS && !stopping(r); round++) {
            if (outbox_cleanup(p->store, r->config->retention_seconds, CLEANUP_LIMIT, &deleted,
                               &err) != 0) {
                store_failed(p, &err);
                return;
            }
            total += deleted;
            if (deleted < CLEANUP_LIMIT)
                break;
        }
        if (total > 0)
            log_event(OUTBOX_LOG_INFO, "deleted old succeeded rows", "rows=%zu", total);
    }
    if (now >= p->next_sample) {
        p->next_sample = now + SAMPLE_EVERY_SECONDS;
        relay_sample(p);
    }
}

/* ---- the pipeline thread ---------------------------------------------------- */

/* Waits for work: a NOTIFY, or the adaptive poll interval. */
static void
wait_for_work(struct pipeline *p, int wait_ms)
{
    relay *r = p->relay;
    struct outbox_error err;
    bool notified = false;

    while (wait_ms > 0 && !stopping(r) && !notified) {
        int slice = wait_ms < WAIT_SLICE_MS ? wait_ms : WAIT_SLICE_MS;

        if (outbox_store_wait(p->store, slice, &notified, &err) != 0) {
            store_failed(p, &err);
            return;
        }
        wait_ms -= slice;
    }
    if (now_seconds() - p->last_sink_idle >= SINK_IDLE_EVERY_SECONDS) {
        p->last_sink_idle = now_seconds();
        if (sink_idle(p->sink, &err) != 0) {
            log_event_limited("broker-error", OUTBOX_LOG_WARN, "broker connection lost",
                              "pipeline=%d broker=%s error=\"%s\"", p->index,
                              sink_display_url(p->sink), err.message);
            metrics_set_up(r->metrics, METRICS_BROKER, false);
        }
    }
}

static void *
pipeline_run(void *arg)
{
    struct pipeline *p = arg;
    relay *r = p->relay;
    const struct relay_config *c = r->config;
    const char *const *queues = (const char *const *)c->queues;
    int idle_ms = 0;
    double last_work = 0;
    bool reaped_once = false;

    if (connect_store(p, true) != 0 || connect_sink(p, true) != 0)
        goto done;

    while (!stopping(r)) {
        struct outbox_batch batch;
        struct outbox_error err;
        double claimed_at;

        if (p->store == NULL && connect_store(p, false) != 0)
            break;
        if (!sink_is_connected(p->sink) && connect_sink(p, false) != 0)
            break;
        metrics_loop_turned(r->metrics);
        if (p->index == 0) {
            maintain(p, c->once && !reaped_once);
            reaped_once = true;
            if (p->store == NULL)
                continue;
        }

        claimed_at = now_seconds();
        if (outbox_claim(p->store, queues, c->queue_count, c->batch_size, c->lease_seconds,
                         &batch, &err) != 0) {
            store_failed(p, &err);
            continue;
        }
        metrics_add(r->metrics, METRICS_CLAIMS, 1);
        if (batch.count == 0) {
            outbox_batch_release_memory(&batch);
            if (c->once)
                break;
            /*
             * Adaptive polling: 1, 2, 4 ... ms, up to BUSY_POLL_MAX_MS while
             * rows came in the last BUSY_WINDOW_SECONDS (a lull in a steady
             * stream must not cost its next rows a long sleep), and up to
             * --poll-interval once the queue has been quiet for longer.
             */
            idle_ms = idle_ms == 0 ? 1 : idle_ms * 2;
            if (now_seconds() - last_work < BUSY_WINDOW_SECONDS && idle_ms > BUSY_POLL_MAX_MS)
                idle_ms = BUSY_POLL_MAX_MS;
            if (idle_ms > c->poll_interval_ms)
                idle_ms = c->poll_interval_ms;
            wait_for_work(p, idle_ms);
            continue;
        }
        idle_ms = 0;
        last_work = now_seconds();
        process_batch(p, &batch, claimed_at);
        outbox_batch_release_memory(&batch);
    }

done:
    sink_disconnect(p->sink);
    drop_store(p);
    atomic_fetch_sub(&r->running, 1);
    return NULL;
}

/* ---- lifecycle ----------------------------------------------------------------- */

/* host:pid:uuid, so a restarted relay never inherits its predecessor's leases. */
static void
make_worker_prefix(char *out, size_t size)
{
    char host[64] = "localhost";
    char uuid_text[37];
    uuid_t uuid;

    gethostname(host, sizeof(host) - 1);
    host[sizeof(host) - 1] = '\0';
    uuid_generate(uuid);
    uuid_unparse_lower(uuid, uuid_text);
    snprintf(out, size, "%s:%d:%s", host, (int)getpid(), uuid_text);
}

static void
pipeline_clear(struct pipeline *p)
{
    sink_free(p->sink);
    outbox_store_free(p->store);
    free(p->messages);
    free(p->outcomes);
    free(p->leases);
    free(p->failures);
    free(p->done);
    free(p->dead);
    free(p->lease_queues);
    free(p->failure_queues);
    free(p->lags);
}

relay *
relay_new(const struct relay_config *config, struct metrics *m, struct outbox_error *err)
{
    relay *r = calloc(1, sizeof(*r));
    size_t n = (size_t)config->batch_size;

    if (r == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        return NULL;
    }
    r->config = config;
    r->metrics = m;
    pthread_mutex_init(&r->fatal_lock, NULL);
    make_worker_prefix(r->worker_prefix, sizeof(r->worker_prefix));
    r->pipelines = calloc((size_t)config->concurrency, sizeof(*r->pipelines));
    if (r->pipelines == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        goto fail;
    }
    for (int i = 0; i < config->concurrency; i++) {
        struct pipeline *p = &r->pipelines[i];
        struct sink_options options = {
            .url = config->broker_url,
            .exchange = config->exchange,
            .stream_prefix = config->stream_prefix,
            .dedup_window_ms = config->dedup_window_ms,
            .stream_maxlen = config->stream_maxlen,
            .max_message_bytes = (size_t)config->max_message_bytes,
            .connect_timeout_ms = 5000,
            .io_timeout_ms = 10000,
            .heartbeat_seconds = 30,
            .tls_verify = config->tls_verify,
        };

        p->relay = r;
        p->index = i;
        p->seed = (unsigned int)getpid() ^ (unsigned int)(i * 7919) ^ (unsigned int)time(NULL);
        snprintf(p->worker_id, sizeof(p->worker_id), "%s/%d", r->worker_prefix, i);
        p->sink = sink_new(&options, err);
        p->messages = calloc(n, sizeof(*p->messages));
        p->outcomes = calloc(n, sizeof(*p->outcomes));
        p->leases = calloc(n, sizeof(*p->leases));
        p->failures = calloc(n, sizeof(*p->failures));
        p->done = calloc(n, sizeof(*p->done));
        p->dead = calloc(n, sizeof(*p->dead));
        p->lease_queues = calloc(n, sizeof(*p->lease_queues));
        p->failure_queues = calloc(n, sizeof(*p->failure_queues));
        p->lags = calloc(n, sizeof(*p->lags));
        if (p->sink == NULL)
            goto fail;
        if (p->messages == NULL || p->outcomes == NULL || p->leases == NULL ||
            p->failures == NULL || p->done == NULL || p->dead == NULL ||
            p->lease_queues == NULL || p->failure_queues == NULL || p->lags == NULL) {
            outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
            goto fail;
        }
    }
    return r;

fail:
    relay_free(r);
    return NULL;
}

void
relay_free(relay *r)
{
    if (r == NULL)
        return;
    for (int i = 0; r->pipelines != NULL && i < r->config->concurrency; i++)
        pipeline_clear(&r->pipelines[i]);
    free(r->pipelines);
    pthread_mutex_destroy(&r->fatal_lock);
    free(r);
}

int
relay_check(relay *r, struct outbox_error *err)
{
    struct pipeline *p = &r->pipelines[0];
    outbox_store *store = outbox_store_connect(r->config->database_url, p->worker_id, err);

    if (store == NULL)
        return -1;
    outbox_store_free(store);
    if (sink_connect(p->sink, err) != 0)
        return -1;
    sink_disconnect(p->sink);
    return 0;
}

int
relay_start(relay *r, struct outbox_error *err)
{
    log_event(OUTBOX_LOG_INFO, "relay starting",
              "worker=%s broker=%s concurrency=%d batch_size=%d lease=%ds", r->worker_prefix,
              sink_display_url(r->pipelines[0].sink), r->config->concurrency,
              r->config->batch_size, r->config->lease_seconds);
    for (int i = 0; i < r->config->concurrency; i++) {
        struct pipeline *p = &r->pipelines[i];

        atomic_fetch_add(&r->running, 1);
        if (pthread_create(&p->thread, NULL, pipeline_run, p) != 0) {
            atomic_fetch_sub(&r->running, 1);
            relay_stop(r);
            return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "unable to start pipeline %d", i);
        }
        p->started = true;
    }
    return 0;
}

void
relay_stop(relay *r)
{
    atomic_store(&r->stopping, 1);
}

bool
relay_finished(relay *r)
{
    return atomic_load(&r->running) == 0;
}

int
relay_join(relay *r, struct outbox_error *err)
{
    for (int i = 0; i < r->config->concurrency; i++) {
        if (r->pipelines[i].started)
            pthread_join(r->pipelines[i].thread, NULL);
        r->pipelines[i].started = false;
    }
    if (atomic_load(&r->fatal)) {
        *err = r->fatal_error;
        return -1;
    }
    return 0;
}
