/*
 * relay.c - claim, publish, mark: the pipelines of outbox-relay.
 *
 * Each pipeline owns one database connection and one broker connection and
 * repeats a turn (relay_turn): the marks of the batch published last and the
 * claim of the next batch are sent to the database ahead of their results,
 * the current batch is published meanwhile, then the results are collected.
 * The database and the broker work at the same time, and no row is marked
 * before the broker confirmed it.
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

#include "clock.h"
#include "error.h"
#include "json.h"
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
/* --once gives up on an end it cannot reach for this long (connect_ends). */
#define ONCE_CONNECT_BUDGET_SECONDS 10.0
/* The broker connection is serviced (heartbeats) at least this often when idle. */
#define SINK_IDLE_EVERY_SECONDS 1.0

/*
 * The rows of one claimed batch, and once it is published, its rows sorted
 * by outcome until the database has marked them: accepted rows are
 * completed, the others failed. Queue names point into the batch, error
 * texts into the outcomes, so both live as long as the settlement.
 */
struct settlement {
    struct outbox_batch batch;
    struct sink_outcome *outcomes;
    struct outbox_lease *leases; /* accepted rows */
    const char **lease_queues;
    size_t accepted;                 /* rows in leases[] not marked yet */
    struct outbox_failure *failures; /* rejected or failed rows */
    const char **failure_queues;
    size_t failed;    /* rows in failures[] not marked yet */
    size_t published; /* rows published, counted in flight until the settlement is cleared */
    bool *done;
    bool *dead;
};

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
    struct outbox_lease *leases; /* for extend and give back */
    bool *done;
    double *lags; /* commit-to-publish seconds of accepted rows */
    /* a batch being published and the one before it, being marked (see relay_turn) */
    struct settlement settlements[2];
    int current;

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
    void (*finished)(void *arg); /* called by the last pipeline to return */
    void *finished_arg;
    atomic_int fatal;
    pthread_mutex_t fatal_lock;
    struct outbox_error fatal_error;
};

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
    double seconds =
        outbox_backoff_seconds(attempt, RECONNECT_FIRST_MS / 1000.0, RECONNECT_MAX_MS / 1000.0,
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

/* What one connection attempt came to. */
enum attempt_result {
    ATTEMPT_CONNECTED,
    ATTEMPT_FAILED, /* worth another try; logged */
    ATTEMPT_FATAL,  /* bad password, no schema at first start: set_fatal() done */
};

/* One attempt to connect the store; err says why it failed. */
static enum attempt_result
try_store(struct pipeline *p, bool first, int attempt, struct outbox_error *err)
{
    relay *r = p->relay;

    p->store = outbox_store_connect(r->config->database_url, p->worker_id, err);
    if (p->store != NULL) {
        PQsetNoticeProcessor(outbox_store_conn(p->store), log_database_notice, p);
        outbox_store_set_block_on_dead_head(p->store, r->config->block_on_dead_head);
        outbox_store_set_delete_on_success(p->store, r->config->delete_on_success);
        metrics_set_up(r->metrics, METRICS_DATABASE, true);
        if (attempt > 1 || !first)
            log_event(OUTBOX_LOG_INFO, "database connected", "pipeline=%d attempts=%d", p->index,
                      attempt);
        return ATTEMPT_CONNECTED;
    }
    metrics_set_up(r->metrics, METRICS_DATABASE, false);
    if (first && !outbox_error_is_transient(err)) {
        set_fatal(r, err);
        return ATTEMPT_FATAL;
    }
    log_event_limited("database-connect", OUTBOX_LOG_WARN, "database unavailable, retrying",
                      "pipeline=%d error=\"%s\"", p->index, err->message);
    metrics_reconnected(r->metrics, METRICS_DATABASE);
    return ATTEMPT_FAILED;
}

/* Like try_store, for the broker. */
static enum attempt_result
try_sink(struct pipeline *p, bool first, int attempt, struct outbox_error *err)
{
    relay *r = p->relay;

    if (sink_connect(p->sink, err) == 0) {
        metrics_set_up(r->metrics, METRICS_BROKER, true);
        p->last_sink_idle = clock_monotonic_seconds();
        if (attempt > 1 || !first)
            log_event(OUTBOX_LOG_INFO, "broker connected", "pipeline=%d broker=%s attempts=%d",
                      p->index, sink_display_url(p->sink), attempt);
        return ATTEMPT_CONNECTED;
    }
    metrics_set_up(r->metrics, METRICS_BROKER, false);
    if (first && !outbox_error_is_transient(err)) {
        set_fatal(r, err);
        return ATTEMPT_FATAL;
    }
    log_event_limited("broker-connect", OUTBOX_LOG_WARN, "broker unavailable, retrying",
                      "pipeline=%d broker=%s error=\"%s\"", p->index, sink_display_url(p->sink),
                      err->message);
    metrics_reconnected(r->metrics, METRICS_BROKER);
    return ATTEMPT_FAILED;
}

/*
 * Connects what is not connected (the database when want_store, the broker
 * when want_sink), trying each end on every attempt so that /healthz knows
 * the state of both, until both work, the relay stops, or a fatal error (bad
 * password, no schema) at first start. With --once it gives up after
 * ONCE_CONNECT_BUDGET_SECONDS: a one-shot run must end. Returns 0 when
 * connected.
 */
static int
connect_ends(struct pipeline *p, bool want_store, bool want_sink, bool first)
{
    relay *r = p->relay;
    double started = clock_monotonic_seconds();

    for (int attempt = 1; !stopping(r); attempt++) {
        struct outbox_error store_err, sink_err;
        enum attempt_result store = ATTEMPT_CONNECTED, broker = ATTEMPT_CONNECTED;

        if (want_store && p->store == NULL)
            store = try_store(p, first, attempt, &store_err);
        if (store != ATTEMPT_FATAL && want_sink && !sink_is_connected(p->sink))
            broker = try_sink(p, first, attempt, &sink_err);
        if (store == ATTEMPT_FATAL || broker == ATTEMPT_FATAL)
            return -1;
        if (store == ATTEMPT_CONNECTED && broker == ATTEMPT_CONNECTED)
            return 0;
        if (r->config->once && clock_monotonic_seconds() - started >= ONCE_CONNECT_BUDGET_SECONDS) {
            struct outbox_error err;

            if (store == ATTEMPT_FAILED && broker == ATTEMPT_FAILED)
                outbox_error_set(&err, OUTBOX_ERR_CONNECTION,
                                 "--once: database and broker unreachable for %.0f s, giving up:"
                                 " %s; %s",
                                 ONCE_CONNECT_BUDGET_SECONDS, store_err.message, sink_err.message);
            else
                outbox_error_set(&err, OUTBOX_ERR_CONNECTION,
                                 "--once: %s unreachable for %.0f s, giving up: %s",
                                 store == ATTEMPT_FAILED ? "database" : "broker",
                                 ONCE_CONNECT_BUDGET_SECONDS,
                                 store == ATTEMPT_FAILED ? store_err.message : sink_err.message);
            set_fatal(r, &err);
            return -1;
        }
        sleep_ms(r, next_backoff_ms(p, attempt));
    }
    return -1;
}

static int
connect_store(struct pipeline *p, bool first)
{
    return connect_ends(p, true, false, first);
}

static void
drop_store(struct pipeline *p)
{
    outbox_store_free(p->store);
    p->store = NULL;
    metrics_set_up(p->relay->metrics, METRICS_DATABASE, false);
}

static int
connect_sink(struct pipeline *p, bool first)
{
    return connect_ends(p, false, true, first);
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
    log_event_limited(
        "database-error", outbox_error_is_transient(err) ? OUTBOX_LOG_WARN : OUTBOX_LOG_ERROR,
        "database error, reconnecting", "pipeline=%d error=\"%s\"", p->index, err->message);
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
add_failure(struct pipeline *p, struct outbox_failure *failure, const struct outbox_job *job,
            struct sink_outcome *outcome)
{
    const struct relay_config *c = p->relay->config;

    sanitize_reason(outcome->reason);
    *failure = (struct outbox_failure){
        .job_id = job->job_id,
        .generation = job->generation,
        .error = outcome->reason[0] ? outcome->reason : "publish failed",
        .retry_seconds =
            outbox_backoff_seconds(job->generation, c->retry_base_seconds, c->retry_max_seconds,
                                   (double)rand_r(&p->seed) / ((double)RAND_MAX + 1)),
        .permanent = outcome->status == SINK_REJECTED,
    };
}

static bool
has_rows(const struct settlement *st)
{
    return st->accepted + st->failed > 0;
}

/*
 * ' trace_id="<32 hex>"' for the log lines about a row, empty for a row
 * without a W3C traceparent; quoted, so that a JSON log keeps it a string.
 */
struct trace_field {
    char text[48];
};

/*
 * The trace field of row job_id of the settlement's batch (sorted by job
 * id), read from its traceparent header "00-<trace id>-<parent id>-<flags>".
 * Only log lines about single rows need it, so the headers are parsed here
 * and not on the way to the broker.
 */
static struct trace_field
trace_field_of(const struct settlement *st, int64_t job_id)
{
    struct trace_field field = {{0}};
    struct json_string_object headers = {0};
    struct outbox_error err;
    size_t low = 0, high = st->batch.count;

    while (low < high) {
        size_t mid = low + (high - low) / 2;

        if (st->batch.jobs[mid].job_id < job_id)
            low = mid + 1;
        else
            high = mid;
    }
    if (low == st->batch.count || st->batch.jobs[low].job_id != job_id ||
        strstr(st->batch.jobs[low].headers, "traceparent") == NULL ||
        json_parse_string_object(st->batch.jobs[low].headers, strlen(st->batch.jobs[low].headers),
                                 &headers, &err) != 0)
        return field;
    for (size_t i = 0; i < headers.count; i++) {
        const struct json_member *m = &headers.members[i];

        if (strcmp(m->key, "traceparent") == 0 && m->value_len == 55 && m->value[2] == '-' &&
            m->value[35] == '-' && strspn(m->value + 3, "0123456789abcdef") == 32)
            snprintf(field.text, sizeof(field.text), " trace_id=\"%.32s\"", m->value + 3);
    }
    json_string_object_clear(&headers);
    return field;
}

/* Records what marking the accepted rows changed; the rest lost their lease. */
static void
record_completed(struct pipeline *p, const struct settlement *st, size_t changed)
{
    relay *r = p->relay;

    for (size_t i = 0; i < st->accepted; i++)
        if (st->done[i])
            metrics_add_queue(r->metrics, METRICS_ROWS_COMPLETED, st->lease_queues[i], 1);
    if (changed < st->accepted) {
        metrics_add(r->metrics, METRICS_LEASE_LOST, st->accepted - changed);
        for (size_t i = 0; i < st->accepted; i++)
            if (!st->done[i])
                log_event_limited("lease-lost", OUTBOX_LOG_WARN,
                                  "lease lost before marking a published row",
                                  "pipeline=%d job_id=%lld%s", p->index,
                                  (long long)st->leases[i].job_id,
                                  trace_field_of(st, st->leases[i].job_id).text);
    }
}

/* Records what giving the failed rows back changed: retried later, or dead. */
static void
record_failed(struct pipeline *p, const struct settlement *st, size_t changed)
{
    relay *r = p->relay;

    for (size_t i = 0; i < st->failed; i++) {
        const struct outbox_failure *f = &st->failures[i];

        if (!st->done[i])
            continue;
        /* a row's last attempt counts as dead only, as the metric's help says */
        if (st->dead[i]) {
            metrics_add_queue(r->metrics, METRICS_ROWS_DEAD, st->failure_queues[i], 1);
            log_event(OUTBOX_LOG_ERROR, "row is dead", "pipeline=%d job_id=%lld%s error=\"%s\"",
                      p->index, (long long)f->job_id, trace_field_of(st, f->job_id).text,
                      f->error);
        } else {
            metrics_add_queue(r->metrics, METRICS_ROWS_FAILED, st->failure_queues[i], 1);
            log_event_limited("publish-failed", OUTBOX_LOG_WARN, "publish failed, will retry",
                              "pipeline=%d job_id=%lld%s retry_in=%.1fs error=\"%s\"", p->index,
                              (long long)f->job_id, trace_field_of(st, f->job_id).text,
                              f->retry_seconds, f->error);
        }
    }
    if (changed < st->failed)
        metrics_add(r->metrics, METRICS_LEASE_LOST, st->failed - changed);
}

/* Forgets a settled (or abandoned) batch. */
static void
settlement_clear(struct pipeline *p, struct settlement *st)
{
    metrics_add_in_flight(p->relay->metrics, -(int64_t)st->published);
    st->accepted = st->failed = st->published = 0;
    outbox_batch_release_memory(&st->batch);
}

/*
 * Sends the marks of a published batch (complete, then fail) ahead of their
 * results. Returns 0, or -1 after dropping the store.
 */
static int
settle_send(struct pipeline *p, const struct settlement *st)
{
    struct outbox_error err;

    if (outbox_complete_send(p->store, st->leases, st->accepted, &err) != 0 ||
        outbox_fail_send(p->store, st->failures, st->failed, &err) != 0) {
        store_failed(p, &err);
        return -1;
    }
    return 0;
}

/*
 * Collects what settle_send() sent and records it. On an error the store is
 * dropped and the marks that were not confirmed are left to settle_now().
 */
static void
settle_receive(struct pipeline *p, struct settlement *st)
{
    struct outbox_error err;
    size_t changed;

    if (outbox_complete_receive(p->store, st->leases, st->accepted, st->done, &changed, &err) !=
        0) {
        store_failed(p, &err);
        return;
    }
    record_completed(p, st, changed);
    st->accepted = 0;
    if (outbox_fail_receive(p->store, st->failures, st->failed, st->done, st->dead, &changed,
                            &err) != 0) {
        store_failed(p, &err);
        return;
    }
    record_failed(p, st, changed);
    st->failed = 0;
}

/*
 * Marks a published batch and waits. If the database is gone, reconnects
 * once and tries again while the leases may still hold; rows it cannot mark
 * stay running and are re-published after their lease (at least once).
 */
static void
settle_now(struct pipeline *p, struct settlement *st)
{
    for (int attempt = 0; attempt < 2 && has_rows(st); attempt++) {
        if (p->store == NULL && connect_store(p, false) != 0)
            break;
        if (settle_send(p, st) == 0)
            settle_receive(p, st);
    }
    settlement_clear(p, st);
}

/* Fills p->leases with the rows of a batch. */
static void
lease_batch(struct pipeline *p, const struct outbox_batch *batch)
{
    for (size_t i = 0; i < batch->count; i++)
        p->leases[i] = (struct outbox_lease){batch->jobs[i].job_id, batch->jobs[i].generation};
}

/* A batch that waited long (for its broker, say) gets a fresh lease before publishing. */
static void
extend_if_stale(struct pipeline *p, const struct outbox_batch *batch, double claimed_at)
{
    const struct relay_config *c = p->relay->config;
    struct outbox_error err;
    size_t changed;

    if (clock_monotonic_seconds() - claimed_at <= c->lease_seconds / 2.0 || p->store == NULL)
        return;
    lease_batch(p, batch);
    if (outbox_extend(p->store, p->leases, batch->count, c->lease_seconds, p->done, &changed,
                      &err) != 0)
        store_failed(p, &err);
}

/*
 * Hands a claimed batch that will not be published back at once, attempt
 * included, then frees it. Without a database the rows come back when
 * their lease runs out.
 */
static void
give_back(struct pipeline *p, struct outbox_batch *batch)
{
    struct outbox_error err;
    size_t changed;

    if (batch->count > 0 && p->store != NULL) {
        lease_batch(p, batch);
        if (outbox_release(p->store, p->leases, batch->count, p->done, &changed, &err) != 0)
            store_failed(p, &err);
    }
    outbox_batch_release_memory(batch);
}

/* Publishes the claimed batch of st and sorts its rows into accepted and failed. */
static void
publish_batch(struct pipeline *p, struct settlement *st)
{
    relay *r = p->relay;
    const struct outbox_batch *batch = &st->batch;
    size_t accepted = 0, failed = 0;
    struct outbox_error err;
    double started, finished, wall;
    int rc;

    if (batch->count == 0)
        return;
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
            .replay = job->replays,
            .exchange = job->exchange,
            .routing_key = job->routing_key,
        };
        metrics_add_queue(r->metrics, METRICS_ROWS_CLAIMED, job->queue, 1);
    }

    metrics_add_in_flight(r->metrics, (int64_t)batch->count);
    st->published = batch->count;
    started = clock_monotonic_seconds();
    rc = sink_publish(p->sink, p->messages, batch->count, st->outcomes, &err);
    finished = clock_monotonic_seconds();
    wall = wall_seconds();
    metrics_observe(r->metrics, METRICS_PUBLISH_DURATION, finished - started);
    if (rc != 0) {
        log_event_limited("broker-error", OUTBOX_LOG_WARN, "broker connection lost",
                          "pipeline=%d broker=%s error=\"%s\"", p->index, sink_display_url(p->sink),
                          err.message);
        metrics_set_up(r->metrics, METRICS_BROKER, false);
    }

    for (size_t i = 0; i < batch->count; i++) {
        const struct outbox_job *job = &batch->jobs[i];

        if (st->outcomes[i].status == SINK_ACCEPTED) {
            st->lease_queues[accepted] = job->queue;
            p->lags[accepted] = wall - job->created_at;
            st->leases[accepted++] = (struct outbox_lease){job->job_id, job->generation};
            metrics_add_queue(r->metrics, METRICS_ROWS_PUBLISHED, job->queue, 1);
        } else {
            st->failure_queues[failed] = job->queue;
            add_failure(p, &st->failures[failed++], job, &st->outcomes[i]);
        }
    }
    metrics_observe_many(r->metrics, METRICS_COMMIT_TO_PUBLISH, p->lags, accepted);
    st->accepted = accepted;
    st->failed = failed;
}

/*
 * One turn of a pipeline. settlements[current] holds a claimed batch (maybe
 * empty), the other slot the previous batch, published but not yet marked.
 * The marks of the previous batch and the next claim go to the database
 * ahead of their results, then this batch is published while the database
 * works on them, then their results are collected:
 *
 *   database  | mark N-1, claim N+1 |              | mark N, claim N+2 | ...
 *   broker    | publish N ........  |              | publish N+1 ....  |
 *
 * Afterwards the slots swap: settlements[current] holds the new claim.
 * Returns true when that claim was made (even if it found nothing), false
 * when it was not (stopping, or the database failed).
 */
static bool
relay_turn(struct pipeline *p, double *claimed_at)
{
    relay *r = p->relay;
    const struct relay_config *c = r->config;
    struct settlement *now = &p->settlements[p->current];
    struct settlement *last = &p->settlements[!p->current];
    struct outbox_batch next = {0};
    struct outbox_error err;
    double next_claimed_at = clock_monotonic_seconds();
    bool marking = false, claiming = false;

    extend_if_stale(p, &now->batch, *claimed_at);
    if (p->store != NULL && has_rows(last))
        marking = settle_send(p, last) == 0;
    if (p->store != NULL && !stopping(r)) {
        if (outbox_claim_send(p->store, (const char *const *)c->queues, c->queue_count,
                              c->batch_size, c->lease_seconds, &err) == 0)
            claiming = true;
        else
            store_failed(p, &err);
    }
    publish_batch(p, now);
    if (marking && p->store != NULL)
        settle_receive(p, last);
    if (claiming && p->store == NULL)
        claiming = false; /* collecting the marks failed and dropped the connection */
    if (claiming && outbox_claim_receive(p->store, &next, &err) != 0) {
        store_failed(p, &err);
        claiming = false;
    }
    if (claiming)
        metrics_add(r->metrics, METRICS_CLAIMS, 1);
    /* marks not confirmed above (the database failed) get one more try */
    settle_now(p, last);

    last->batch = next;
    p->current = !p->current;
    *claimed_at = next_claimed_at;
    return claiming;
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
    s->items[s->count].paused = backlog->paused;
    s->items[s->count].paused_keys = backlog->paused_keys;
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
    metrics_set_horizon_age(r->metrics, horizon.found ? horizon.age_seconds : 0);
    if (horizon.found && r->config->horizon_warning_seconds > 0 &&
        horizon.age_seconds > r->config->horizon_warning_seconds)
        log_event_limited("xmin-horizon", OUTBOX_LOG_WARN,
                          "an open transaction holds back vacuum; the queue will slow down",
                          "age=%.0fs pid=%d application=\"%s\" state=\"%s\"", horizon.age_seconds,
                          horizon.pid, horizon.application, horizon.state);
}

static void
maintain(struct pipeline *p, bool force)
{
    relay *r = p->relay;
    double now = clock_monotonic_seconds();
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
                log_event(OUTBOX_LOG_INFO, "released rows waiting for a finished key", "rows=%zu",
                          released);
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
    if (clock_monotonic_seconds() - p->last_sink_idle >= SINK_IDLE_EVERY_SECONDS) {
        p->last_sink_idle = clock_monotonic_seconds();
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
    double last_work = 0, claimed_at = 0;
    bool reaped_once = false;
    bool claimed = false; /* the current slot holds a claim made by relay_turn() */

    if (connect_ends(p, true, true, true) != 0)
        goto done;

    while (!stopping(r)) {
        struct settlement *now = &p->settlements[p->current];
        struct outbox_error err;

        if (p->store == NULL && connect_store(p, false) != 0)
            break;
        if (!sink_is_connected(p->sink)) {
            /* published rows are marked and claimed ones handed back before the outage */
            settle_now(p, &p->settlements[!p->current]);
            give_back(p, &now->batch);
            claimed = false;
            if (connect_sink(p, false) != 0)
                break;
        }
        metrics_loop_turned(r->metrics);
        if (p->index == 0) {
            maintain(p, c->once && !reaped_once);
            reaped_once = true;
            if (p->store == NULL)
                continue;
        }

        if (!claimed && now->batch.count == 0) {
            claimed_at = clock_monotonic_seconds();
            if (outbox_claim(p->store, queues, c->queue_count, c->batch_size, c->lease_seconds,
                             &now->batch, &err) != 0) {
                store_failed(p, &err);
                continue;
            }
            metrics_add(r->metrics, METRICS_CLAIMS, 1);
        }
        claimed = false;
        if (now->batch.count == 0 && !has_rows(&p->settlements[!p->current])) {
            outbox_batch_release_memory(&now->batch);
            if (c->once)
                break;
            /*
             * Adaptive polling: 1, 2, 4 ... ms, up to BUSY_POLL_MAX_MS while
             * rows came in the last BUSY_WINDOW_SECONDS (a lull in a steady
             * stream must not cost its next rows a long sleep), and up to
             * --poll-interval once the queue has been quiet for longer.
             */
            idle_ms = idle_ms == 0 ? 1 : idle_ms * 2;
            if (clock_monotonic_seconds() - last_work < BUSY_WINDOW_SECONDS && idle_ms > BUSY_POLL_MAX_MS)
                idle_ms = BUSY_POLL_MAX_MS;
            if (idle_ms > c->poll_interval_ms)
                idle_ms = c->poll_interval_ms;
            wait_for_work(p, idle_ms);
            continue;
        }
        idle_ms = 0;
        last_work = clock_monotonic_seconds();
        claimed = relay_turn(p, &claimed_at);
    }
    /* the last published batch is marked; a claim made for the next turn goes back */
    settle_now(p, &p->settlements[!p->current]);
    give_back(p, &p->settlements[p->current].batch);

done:
    sink_disconnect(p->sink);
    drop_store(p);
    if (atomic_fetch_sub(&r->running, 1) == 1 && r->finished != NULL)
        r->finished(r->finished_arg);
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
settlement_free(struct settlement *st)
{
    outbox_batch_release_memory(&st->batch);
    free(st->outcomes);
    free(st->leases);
    free(st->lease_queues);
    free(st->failures);
    free(st->failure_queues);
    free(st->done);
    free(st->dead);
}

static int
settlement_init(struct settlement *st, size_t n)
{
    st->outcomes = calloc(n, sizeof(*st->outcomes));
    st->leases = calloc(n, sizeof(*st->leases));
    st->lease_queues = calloc(n, sizeof(*st->lease_queues));
    st->failures = calloc(n, sizeof(*st->failures));
    st->failure_queues = calloc(n, sizeof(*st->failure_queues));
    st->done = calloc(n, sizeof(*st->done));
    st->dead = calloc(n, sizeof(*st->dead));
    return st->outcomes && st->leases && st->lease_queues && st->failures && st->failure_queues &&
                   st->done && st->dead
               ? 0
               : -1;
}

static void
pipeline_clear(struct pipeline *p)
{
    sink_free(p->sink);
    outbox_store_free(p->store);
    free(p->messages);
    free(p->leases);
    free(p->done);
    free(p->lags);
    settlement_free(&p->settlements[0]);
    settlement_free(&p->settlements[1]);
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
            .redis_wait_replicas = config->redis_wait,
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
        p->leases = calloc(n, sizeof(*p->leases));
        p->done = calloc(n, sizeof(*p->done));
        p->lags = calloc(n, sizeof(*p->lags));
        if (p->sink == NULL)
            goto fail;
        if (p->messages == NULL || p->leases == NULL || p->done == NULL || p->lags == NULL ||
            settlement_init(&p->settlements[0], n) != 0 ||
            settlement_init(&p->settlements[1], n) != 0) {
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
relay_check(relay *r, bool *configuration, struct outbox_error *err)
{
    struct pipeline *p = &r->pipelines[0];
    outbox_store *store = outbox_store_connect(r->config->database_url, p->worker_id, err);
    int rc;

    *configuration = false;
    if (store == NULL) {
        *configuration = strcmp(err->sqlstate, "42501") == 0;
        return -1;
    }
    rc = outbox_store_check_privileges(store, err);
    outbox_store_free(store);
    if (rc != 0) {
        *configuration = err->code == OUTBOX_ERR_CONFIG;
        return -1;
    }
    if (sink_connect(p->sink, err) != 0)
        return -1;
    rc = sink_check(p->sink, err);
    sink_disconnect(p->sink);
    if (rc != 0) {
        *configuration = err->code == OUTBOX_ERR_CONFIG;
        return -1;
    }
    return 0;
}

int
relay_start(relay *r, void (*finished)(void *arg), void *arg, struct outbox_error *err)
{
    r->finished = finished;
    r->finished_arg = arg;
    log_event(OUTBOX_LOG_INFO, "relay starting",
              "worker=%s broker=%s concurrency=%d batch_size=%d lease=%ds", r->worker_prefix,
              sink_display_url(r->pipelines[0].sink), r->config->concurrency, r->config->batch_size,
              r->config->lease_seconds);
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
